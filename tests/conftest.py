"""Test-wide settings: offline hubs, and one torch thread (tiny models only lose time to thread
synchronisation, badly so when the machine is busy); real-model tests raise it themselves."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
