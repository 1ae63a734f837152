"""A contender that does not import (tests/test_contenders.py)."""
import a_module_that_does_not_exist  # noqa: F401
