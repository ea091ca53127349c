"""The interpretability tests run under the tier settings a user gets (issue 34 item 1): the
rest of the suite switches cold start and fused groups off (``tests/conftest.py``), this folder's
``conftest`` switches them back on for every test that is not pinned to one tier."""

from circuits.backend import tiers


def test_interp_tests_run_with_the_settings_a_user_gets():
    assert tiers.settings() == tiers.Settings()  # every field at its default, as in a user's process
    assert tiers.settings().cold_start and tiers.settings().groups and tiers.settings().background
    assert tiers.settings().pinned is None

