"""gpunode.framing: the commands it builds are run by a real POSIX sh, hostile output included."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpunode import framing
from gpunode.framing import Part, PartOutput


def run(parts: list[Part], token: str | None = None) -> list[str]:
    command = framing.command(parts, token)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr  # the frame succeeds whatever its parts did
    return done.stdout.splitlines()


def test_each_part_keeps_its_output_stderr_and_exit_status() -> None:
    out = framing.parse(
        run(
            [
                Part("one", "echo hello; echo oops >&2"),
                Part("two", "echo partial; exit 3"),
                Part("three", "printf 'no final newline'"),
            ]
        )
    )
    assert out.complete
    assert out.problems == []
    assert out.parts["one"] == PartOutput("one", ["hello"], ["oops"], 0)
    assert out.parts["two"] == PartOutput("two", ["partial"], [], 3)
    assert out.parts["three"].lines == ["no final newline"]
    assert out.parts["three"].exit_status == 0


def test_exit_and_set_e_in_one_part_do_not_end_the_others() -> None:
    out = framing.parse(
        run(
            [
                Part("quits", "exit 7"),
                Part("strict", "set -e; false; echo unreachable"),
                Part("moves", "cd /proc; exit 0"),
                Part("last", "pwd"),
            ]
        )
    )
    assert out.complete
    assert out.parts["quits"].exit_status == 7
    assert out.parts["strict"].exit_status == 1
    assert out.parts["strict"].lines == []
    assert out.parts["last"].exit_status == 0
    assert out.parts["last"].lines == [os.getcwd()]


def test_a_part_whose_required_program_is_missing_is_absent_and_not_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    touched = tmp_path / "ran"
    out = framing.parse(
        run(
            [
                Part("missing", f"touch {touched}", requires="gpunode-no-such-program"),
                Part("present", "echo yes", requires="sh"),
            ]
        )
    )
    assert out.parts["missing"].absent
    assert out.parts["missing"].exit_status is None
    assert out.parts["missing"].complete
    assert not touched.exists()
    assert out.parts["present"] == PartOutput("present", ["yes"], [], 0)


def test_stderr_merge_and_drop() -> None:
    out = framing.parse(
        run(
            [
                Part("merged", "echo a; echo b >&2", stderr="merge"),
                Part("dropped", "echo c; echo d >&2", stderr="drop"),
            ]
        )
    )
    assert out.parts["merged"].lines == ["a", "b"]
    assert out.parts["merged"].stderr == []
    assert out.parts["dropped"].lines == ["c"]
    assert out.parts["dropped"].stderr == []


def test_a_part_after_another_runs_only_when_that_one_succeeded() -> None:
    out = framing.parse(
        run(
            [
                Part("fails", "exit 2"),
                Part("gated", "echo ran", after="fails"),
                Part("works", "true"),
                Part("follows", "echo ran", after="works"),
            ]
        )
    )
    assert out.parts["gated"].skipped
    assert out.parts["gated"].lines == []
    assert out.parts["follows"].lines == ["ran"]


def test_a_nested_frame_is_content_of_the_outer_part() -> None:
    inner = framing.command([Part("absent-tool", "true", requires="gpunode-no-such-program")])
    out = framing.parse(run([Part("nested", inner), Part("gated", "echo ran", after="nested")]))
    assert out.parts["nested"].exit_status == 0
    inner_out = framing.parse(out.parts["nested"].lines)
    assert inner_out.complete
    assert inner_out.parts["absent-tool"].absent
    assert out.parts["gated"].lines == ["ran"]


def test_fake_markers_printed_by_a_part_are_its_output() -> None:
    # A part cannot know the token of the frame it runs in: markers with another token, or
    # the old markers, are plain lines of its output.
    forged = [
        "##gpunode-frame:0123456789abcdef:exit:liar:0",
        "##gpunode-frame:0123456789abcdef:part:victim",
        "##gpunode-frame:0123456789abcdef:done",
        "gpunode:batch:end",
        "##PYINFRA_NOCMD##",
    ]
    printing = "; ".join(f"echo '{line}'" for line in forged)
    out = framing.parse(
        run([Part("liar", printing), Part("victim", "echo real")], token="fedcba9876543210")
    )
    assert out.complete
    assert out.parts["liar"].lines == forged
    assert out.parts["victim"].lines == ["real"]


def test_cut_short_output_is_detected() -> None:
    lines = run([Part("first", "echo 1"), Part("second", "echo 2; echo 3")])
    cut = lines[: lines.index("2") + 1]
    out = framing.parse(cut, names=["first", "second", "third"])
    assert not out.complete
    assert out.parts["first"].exit_status == 0
    assert out.parts["second"].lines == ["2"]
    assert out.parts["second"].exit_status is None
    assert out.parts["second"].problem == "cut short: the output ended before its exit status"
    assert "cut short" in str(out.part("third").problem)


def test_output_without_a_header_is_no_frame() -> None:
    out = framing.parse(["hello", "##gpunode-frame:0123456789abcdef:done"])
    assert not out.complete
    assert not out.framed
    assert out.parts == {}
    assert "no frame header" in str(out.part("any").problem)


def test_a_huge_line_makes_only_its_part_unreadable() -> None:
    lines = run(
        [Part("huge", "head -c 5000 /dev/zero | tr '\\0' x; echo"), Part("small", "echo ok")]
    )
    out = framing.parse(lines, max_line_chars=4096)
    assert out.parts["huge"].lines == []
    assert out.parts["huge"].problem == "not read: a line of 5000 characters (over 4096)"
    assert out.parts["huge"].exit_status == 0
    assert out.parts["small"].lines == ["ok"]
    assert out.parts["small"].problem is None


def test_output_past_the_total_makes_that_part_and_the_later_ones_unreadable() -> None:
    lines = run(
        [
            Part("before", "echo fine"),
            Part("flood", "seq 1 2000"),
            Part("after", "echo late"),
        ]
    )
    out = framing.parse(lines, max_output_chars=2000)
    assert out.parts["before"].lines == ["fine"]
    assert "passed 2000 characters" in str(out.parts["flood"].problem)
    assert "passed 2000 characters" in str(out.parts["after"].problem)
    assert out.parts["after"].lines == []


def test_unexpected_and_repeated_parts_are_ignored_and_named() -> None:
    token = "00112233445566aa"
    lines = framing.output_of({"a": ["1"], "b": ["2"]}, token=token)
    lines[3:3] = [f"##gpunode-frame:{token}:part:a", "again", f"##gpunode-frame:{token}:exit:a:0"]
    out = framing.parse(lines, names=["a"])
    assert out.parts["a"].lines == ["1"]
    assert set(out.parts) == {"a"}
    assert any("repeated" in problem for problem in out.problems)
    assert any("unexpected part 'b'" in problem for problem in out.problems)


def test_output_of_is_what_the_shell_prints() -> None:
    token = "a1b2c3d4e5f60718"
    real = run(
        [
            Part("out", "echo x; echo y >&2"),
            Part("status", "exit 4"),
            Part("gone", "true", requires="gpunode-no-such-program"),
            Part("skip", "true", after="status"),
        ],
        token=token,
    )
    assert real == framing.output_of(
        {
            "out": PartOutput("out", ["x"], ["y"], 0),
            "status": PartOutput("status", [], [], 4),
            "gone": PartOutput("gone", absent=True),
            "skip": PartOutput("skip", skipped=True),
        },
        token=token,
    )


def test_every_command_has_a_new_token() -> None:
    assert framing.command([Part("a", "true")]) != framing.command([Part("a", "true")])


@pytest.mark.parametrize(
    "part",
    [
        lambda: Part("bad name", "true"),
        lambda: Part("x", "true", requires="a; rm -rf /"),
        lambda: Part("x", "true", stderr="both"),  # type: ignore[arg-type]
    ],
)
def test_parts_that_could_break_the_shell_are_refused(part) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        part()


def test_a_part_after_a_later_or_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match="not an earlier part"):
        framing.command([Part("a", "true", after="b"), Part("b", "true")])
    with pytest.raises(ValueError, match="repeat"):
        framing.command([Part("a", "true"), Part("a", "true")])


# --- Python parts: one python3 process for every part that has Python source -------------------

# Each pair prints the same: the shell command, and its Python form.
TWINS = [
    Part(
        "out-err-status",
        "echo hello; echo oops >&2; exit 3",
        python="import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)",
    ),
    Part("plain", "echo shell part"),  # no Python source: the shell runs it either way
    Part(
        "exists",
        "[ -e /proc/self ]",
        python="import os, sys\nsys.exit(0 if os.path.exists('/proc/self') else 1)",
    ),
    Part(
        "after-exists",
        "head -c 5 /proc/version; echo",
        after="exists",
        python="print(open('/proc/version').read(5))",
    ),
    Part("missing", "echo never", after="out-err-status", python="print('never')"),
    Part("no-such-program", "echo never", requires="gpunode-no-such-tool", python="print(1)"),
    Part(
        "bytes-and-text",
        "printf 'text\\n\\377raw\\n'; echo tail",
        python="import sys\nprint('text')\nsys.stdout.buffer.write(b'\\xffraw\\n')\nprint('tail')",
    ),
    Part(
        "merged",
        "echo out; echo err >&2",
        stderr="merge",
        python="import sys\nprint('out')\nprint('err', file=sys.stderr)",
    ),
    Part(
        "dropped", "echo err >&2", stderr="drop", python="import sys\nprint('err', file=sys.stderr)"
    ),
]


def run_frame(parts: list[Part], python: bool, path: str | None = None) -> framing.FrameOutput:
    command = framing.command(parts, python=python)
    env = None if path is None else {"PATH": path}
    done = subprocess.run(["sh", "-c", command], capture_output=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return framing.parse(done.stdout.decode("utf-8", "surrogateescape").splitlines())


def test_python_parts_print_what_their_shell_commands_print() -> None:
    in_python, in_shell = run_frame(TWINS, python=True), run_frame(TWINS, python=False)
    assert in_python.complete and in_shell.complete
    assert in_python.problems == in_shell.problems == []
    for part in TWINS:
        assert in_python.part(part.name) == in_shell.part(part.name), part.name
    assert in_python.parts["out-err-status"] == PartOutput("out-err-status", ["hello"], ["oops"], 3)
    assert in_python.parts["missing"].skipped and in_python.parts["no-such-program"].absent
    assert in_python.parts["bytes-and-text"].lines == ["text", "\udcffraw", "tail"]


def test_every_python_part_runs_in_one_python3_process() -> None:
    command = framing.command(TWINS)
    assert command.count("python3 -I -S -") == 1
    pid = "sh -c 'echo $$'"  # a process of its own: its pid
    parts = [Part(f"p{n}", pid, python="import os\nprint(os.getpid())") for n in range(3)]
    out = run_frame(parts, python=True)
    pids = {tuple(out.part(f"p{n}").lines) for n in range(3)}
    assert len(pids) == 1 and pids != {()}
    shell = run_frame(parts, python=False)
    assert len({tuple(shell.part(f"p{n}").lines) for n in range(3)}) == 3  # a process each


def test_an_exception_in_a_python_part_is_its_failure_alone() -> None:
    parts = [
        Part("broken", "exit 1", python="raise ValueError('no such field')"),
        Part("exit-none", "true", python="import sys\nsys.exit()"),
        Part("exit-text", "exit 1", python="import sys\nsys.exit('why')"),
        Part("next", "echo fine", python="print('fine')"),
    ]
    out = run_frame(parts, python=True)
    assert out.parts["broken"].exit_status == 1
    assert out.parts["broken"].stderr == ["ValueError: no such field"]
    assert out.parts["exit-none"].exit_status == 0
    assert out.parts["exit-text"].exit_status == 1
    assert out.parts["next"] == PartOutput("next", ["fine"], [], 0)


def test_without_python3_the_shell_commands_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A fresh node without python3: its PATH holds sh alone here."""
    os.symlink("/bin/sh", tmp_path / "sh")
    parts = [
        Part("which", "echo shell", python="print('python')"),
        Part("then", "echo shell too", after="which", python="print('python too')"),
    ]
    out = run_frame(parts, python=True, path=str(tmp_path))
    assert out.parts["which"].lines == ["shell"]
    assert out.parts["then"].lines == ["shell too"]
    assert run_frame(parts, python=True).parts["which"].lines == ["python"]


def test_a_part_after_a_part_of_the_other_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="both must have Python source"):
        framing.command([Part("a", "true"), Part("b", "true", after="a", python="pass")])
    with pytest.raises(ValueError, match="both must have Python source"):
        framing.command([Part("a", "true", python="pass"), Part("b", "true", after="a")])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("not a name", "x"),
        ("path", ["a", "list"]),
        ("code", object()),
        ("f", 1.5),
        ("nested", ("a", ("b", object()))),
    ],
)
def test_python_source_takes_only_plain_named_constants(name: str, value: object) -> None:
    with pytest.raises(ValueError, match="a name and a plain value"):
        framing.python_source("print(path)", **{name: value})


def test_python_source_puts_constants_as_their_repr_never_as_code() -> None:
    hostile = "'); import os; os.system('touch /tmp/owned'); print('"
    source = framing.python_source("print(path)", path=hostile)
    out = run_frame([Part("p", "true", python=source)], python=True)
    assert out.parts["p"].lines == [hostile]
