"""Built-in strategies of PACER-SD, registered through entry points like any third-party plugin."""
