"""Hints in meshrun's messages, as the user can run them: the program that runs, and the flags
this command was given that the hinted task needs to find the same hosts and runs."""

from __future__ import annotations

from meshrun.deploy.render.hints import as_run, repeated_flags

FLAGS = {"inventory": "inv/lab 1.yaml", "runs_dir": "/r"}


def test_hints_name_the_program_that_runs() -> None:
    """Run as `meshrun` in a project with no fabfile, a `fab TASK` hint would fail. Only a task
    after a lone `fab` changes: not `./fab train`, `fabulous`, or `fab` alone."""
    text = "run: fab trust --hosts gpu1; see `fab check-network`; fab stop --run x; fabulous fab; ./fab train; fab"
    assert as_run(text, "meshrun") == ("run: meshrun trust --hosts gpu1; see `meshrun check-network`; meshrun stop "
                                       "--run x; fabulous fab; ./fab train; fab")
    assert as_run(text, "fab") == text


def test_hints_repeat_the_inventory_only_for_tasks_that_read_one() -> None:
    """`fab setup --hosts gpu2` after `fab train --inventory lab.yaml` would read the default
    inventory; `fab stop` reads the run's record, so it gets the runs dir but no inventory."""
    text = "fix it: fab setup --hosts gpu2; then `fab train`; stop: fab stop --run x (fab check-network)"
    assert as_run(text, "fab", FLAGS) == (
        "fix it: fab setup --inventory 'inv/lab 1.yaml' --runs-dir /r --hosts gpu2; then "
        "`fab train --inventory 'inv/lab 1.yaml' --runs-dir /r`; stop: fab stop --runs-dir /r --run x "
        "(fab check-network --inventory 'inv/lab 1.yaml' --runs-dir /r)")
    assert as_run(text, "meshrun", {"project": "../p"}) == (
        "fix it: meshrun setup --project ../p --hosts gpu2; then `meshrun train --project ../p`; "
        "stop: meshrun stop --project ../p --run x (meshrun check-network --project ../p)")


def test_flags_go_only_where_a_command_goes_on() -> None:
    """Prose that names a task gets no flags; two tasks at once get what both take; a firewall
    hint gets them after its action; a usage line's optional part stays after them."""
    prose = "fab trust: 2 new host key(s); not among the files fab sync sends"
    assert as_run(prose, "fab", FLAGS) == prose
    assert as_run("`fab join|leave --run ID`", "fab", FLAGS) == "`fab join|leave --runs-dir /r --run ID`"
    assert as_run("fab firewall up, then fab firewall down when it ends", "fab", {"inventory": "i.yaml"}) == (
        "fab firewall up --inventory i.yaml, then fab firewall down --inventory i.yaml when it ends")
    assert as_run("`fab sync [--data SRC]`", "fab", {"inventory": "i.yaml"}) == "`fab sync --inventory i.yaml [--data SRC]`"


def test_the_flags_repeated_are_those_given() -> None:
    """From a task's keyword arguments: only the three flags, only when given a value."""
    given = {"inventory": "lab.yaml", "project": "", "runs_dir": "runs2", "hosts": "gpu1", "json": True}
    assert repeated_flags(given) == {"inventory": "lab.yaml", "runs_dir": "runs2"}
    assert repeated_flags({"inventory": "", "debug": False}) == {}
