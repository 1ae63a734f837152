"""A contender with only some adapters (tests/test_contenders.py): the Triton attention raises
NotImplementedError, DDP is missing, the sharded optimizer raises NotImplementedError."""


def get_flashattention_autograd_function_triton():
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    raise NotImplementedError("not written yet")
