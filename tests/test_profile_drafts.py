"""`[model] drafts = [...]` (issue 44, item 4): the drafts a profile lists, the first of which loads; `draft`
stays valid, and beside `drafts` may only restate its first; the demo lists both of its drafts; `profile show`
and `profile validate` name them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import profiles
from dflash_tui.engines.errors import UserError


def test_drafts_lists_the_drafts_the_first_loads_and_a_conflicting_draft_is_one_sentence(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[model]\ntarget = "org/t"\ndrafts = ["org/one", "org/two"]\n')
    p = profiles.load_profile(str(path))
    assert (p.draft, p.drafts) == ("org/one", ("org/one", "org/two"))
    assert p.engine_config("cuda").draft == "org/one"
    assert p.with_draft("org/two").engine_config("cuda").draft == "org/two"
    only = tmp_path / "only.toml"  # `draft` alone stays valid, and so does restating the first of drafts
    only.write_text('[model]\ntarget = "org/t"\ndraft = "org/one"\n')
    assert (profiles.load_profile(str(only)).draft, profiles.load_profile(str(only)).drafts) == ("org/one", ())
    path.write_text('[model]\ntarget = "org/t"\ndraft = "org/one"\ndrafts = ["org/one", "org/two"]\n')
    assert profiles.load_profile(str(path)).draft == "org/one"

    path.write_text('[model]\ntarget = "org/t"\ndraft = "org/two"\ndrafts = ["org/one", "org/two"]\n')
    with pytest.raises(UserError) as refused:
        profiles.load_profile(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}, line 3: model.draft is 'org/two' but drafts starts with 'org/one'")
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence, with the fix
    for bad in ("[]", '["org/one", "org/one"]', '["org/one", 3]', '"org/one"'):
        path.write_text(f'[model]\ntarget = "org/t"\ndrafts = {bad}\n')
        with pytest.raises(UserError, match=r"line 3: model.drafts must be a non-empty list of distinct"):
            profiles.load_profile(str(path))

    path.write_text('[model]\ntarget = "org/t"\ndraft = "org/two"\ndrafts = ["org/one", "org/two"]\n')
    result = CliRunner().invoke(main, ["profile", "validate", str(path)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1 and "drafts starts with" in result.stderr


def test_the_demo_profile_lists_both_of_its_drafts_and_show_and_validate_name_them():
    demo = profiles.load_profile("demo")
    assert demo.drafts == ("demo/draft", "demo/draft2") and demo.draft == "demo/draft"
    assert all(Path(demo.local_path(d)).is_dir() for d in demo.drafts)
    shown = CliRunner().invoke(main, ["profile", "show", "demo"])
    assert shown.exit_code == 0 and 'drafts = ["demo/draft", "demo/draft2"]' in shown.stdout
    assert "# drafts: demo/draft loads; the chat's palette (ctrl+p, Draft:) switches to demo/draft2" in shown.stdout
    checked = CliRunner().invoke(main, ["profile", "validate", str(demo.path)])
    assert checked.exit_code == 0 and "demo/target + demo/draft (drafts to switch to: demo/draft2)" in checked.stdout




def test_copies_of_the_demo_keep_finding_both_drafts(config_dir):
    """`profile new --from demo` and tune's user copy write the relative drafts as absolute folders."""
    from dflash_tui.measure import tune

    builtin = profiles.load_profile("demo")
    folders = [str(Path(builtin.local_path(d)).resolve()) for d in builtin.drafts]
    assert CliRunner().invoke(main, ["profile", "new", "mydemo", "--from", "demo"]).exit_code == 0
    assert [str(Path(d).resolve()) for d in profiles.load_profile("mydemo").drafts] == folders
    path, changes = tune.write_best(builtin, {"block_size": 4})
    assert any(c.startswith("[model] drafts: demo/draft, demo/draft2 -> ") for c in changes), changes
    tuned = profiles.load_profile("demo")
    assert tuned.origin == "user" and [str(Path(d).resolve()) for d in tuned.drafts] == folders
    assert tuned.engine_config("cuda").draft == tuned.drafts[0]
