"""docs/METRICS.md keeps in step with the probe's textfile (gpunode/probe/textfile.py): every
metric it can write is documented with its type and labels, and no documented name is stale."""

from __future__ import annotations

import re
from pathlib import Path

from gpunode.probe import textfile
from gpunode.probe.textfile import Expected, render_prometheus

from .test_probe import XID_LINE, hardware, share_dir  # noqa: F401
from .test_probe_metrics import report_of

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "METRICS.md"
# A row of the probe's table: | `name` | type | `label`, `label` or - | meaning |
ROW = re.compile(r"^\| `(gpunode_[a-z_]+)` \| (gauge|counter) \| ([^|]*) \| [^|]+ \|$")
TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
SAMPLE_LABELS = re.compile(r'([a-z_]+)="')


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels) of each row of docs/METRICS.md's probe table."""
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, kind, labels = match.groups()
            assert name not in rows, f"{name} documented twice"
            found = frozenset(re.findall(r"`([a-z_]+)`", labels))
            assert found or labels.strip() == "-", line
            rows[name] = (kind, found)
    return rows


def rendered() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels seen) of the textfiles of an H100 and an A100 node (retired
    pages are A100's) with every optional family in them."""
    families: dict[str, tuple[str, set[str]]] = {}
    for profile in ("hgx-h100", "a100"):
        report = report_of(hardware(profile), journal=XID_LINE + "\n")
        report["driver_versions"] = {**(report.get("driver_versions") or {}), "mismatch": False}
        text = render_prometheus(
            report,
            Expected(gpu_count=8, nvlinks_per_gpu=18, persistence_mode=True),
            [{"path": "/etc/gpunode/tls/node.crt", "not_after_seconds": 1830000000}],
        )
        for line in text.splitlines():
            if match := TYPE.match(line):
                families.setdefault(match.group(1), (match.group(2), set()))
            elif line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, maxsplit=1)[0]
                families[name][1].update(SAMPLE_LABELS.findall(line.partition("}")[0]))
    return {name: (kind, frozenset(labels)) for name, (kind, labels) in families.items()}


def test_every_name_the_textfile_module_writes_is_documented_and_none_is_stale() -> None:
    # Every metric name in the module's source, written under a condition or not.
    written = set(re.findall(r'"(gpunode_[a-z_]+)"', Path(textfile.__file__).read_text()))
    assert written, "no metric names found in textfile.py"
    assert set(documented()) == written


def test_each_documented_type_and_label_set_is_what_is_rendered() -> None:
    docs = documented()
    families = rendered()
    # The render covers every family (the certificate, expectation and XID ones included).
    assert set(families) == set(docs)
    for name, (kind, labels) in families.items():
        assert docs[name][0] == kind, name
        if labels:  # a family with samples: exactly the documented labels
            assert docs[name][1] == labels, (name, sorted(labels))
