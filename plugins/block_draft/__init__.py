"""Block drafters: ``dflash`` (one forward drafts a whole block from the target's hidden states) and
its student for ``pacer distill student.kind=dflash``."""
