"""CI's marked subsets and the slow files run first (tests/conftest.py) name
test files that exist: a renamed file would otherwise drop out of the
sanitizer's run unseen."""
from pathlib import Path

import conftest

HERE = Path(__file__).resolve().parent


def test_the_subsets_name_existing_test_files():
    for subset in (conftest.INSTALL_CHECK, conftest.SANITIZE, set(conftest.SLOW_FIRST)):
        assert subset and all((HERE / name).is_file() for name in subset), \
            sorted(name for name in subset if not (HERE / name).is_file())


def test_the_tests_of_files_and_garbage_input_run_under_the_sanitizers():
    # Every test file about damaged files, faults or garbage input.
    named = {p.name for p in HERE.glob("test_*.py")
             if any(word in p.name for word in ("garbage", "damaged", "faults", "bad_input",
                                                "core", "column"))}
    assert named <= conftest.SANITIZE, sorted(named - conftest.SANITIZE)
