"""Every string field of the model, fuzzed: refused by validation, or the node sees it literally.

The fields are found by walking the DesiredState dataclass tree (str, str | None, tuples of
str, the keys and values of dict[str, str]), so a field added to the model is fuzzed without a
change here. Each gets random text mixing control characters, shell and config-file
metacharacters, and near-valid values. The property (issue 12): build_desired_state reports a
problem at that field's key path, or the accepted value is exactly the text given, holds no
control character, and every renderer that puts it on a node (sshd_config, nccl.conf,
sysctl.d, apt.conf, deb822 sources, fstab, authorized keys, interfaces.d, systemd units, shell
commands) gives it back as one literal word or value, adding no line or directive.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import posixpath
import re
import runpy
import shlex
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.api import DeployError

from gpunode.distributions import BY_CODENAME
from gpunode.distributions import DEFAULT as DEFAULT_DISTRIBUTION
from gpunode.expected.sshd import render_sshd_config
from gpunode.model import SSH_KEY_TYPES, DesiredState, IpoibInterface, build_desired_state
from gpunode.pki import wanted_certificate
from gpunode.schema import unprintable_character
from roles.base import render_archive_sources, render_debian_sources, render_proxy
from roles.infiniband import render_ipoib
from roles.kernel import (
    parse_sysctl_conf,
    render_module_blacklist,
    render_sysctl_conf,
    set_command,
    sysctl_values,
)
from roles.nccl import render_nccl_conf, render_nccl_profile
from roles.nvidia_repos import nvidia_repositories_for
from roles.nvme_cache import fstab_command, fstab_line, render_cachefilesd_conf
from roles.unattended_upgrades import render_unattended_upgrades_conf

from .test_model import ED25519

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,  # no .hypothesis directory in the checkout
    derandomize=True,  # the same examples on every run: CI is deterministic
    suppress_health_check=[HealthCheck.too_slow],
)

# Characters that have broken out of a value somewhere: line ends, C0/C1 controls, DEL,
# Unicode separators, a lone surrogate, bidi overrides; shell, apt.conf, sshd and fstab syntax.
HOSTILE = [
    *"\n\r\t\x00\x0b\x0c\x1b\x7f\x85\u2028\u2029\ud800\u202e\u00a0",
    *"$`;|&\"'\\ {}()<>*?#%=,:/.@+-^~![]",
    *("$(id)", "${IFS}", "`id`", "\nPermitRootLogin yes", '";', "/../", "//"),
]
# Valid or near-valid values, so that the fuzz also explores what validation accepts; each
# field adds its own defaults.
SEEDS = (
    "", "alice", "/raid", "/mnt/x", "http://proxy:3142/", "https://mirror.example/debian",
    "fe80::1%eth0", "10.0.0.0/8", "10.0.0.1", "fd00::1", "192.168.1.2/24", "node1.example",
    "vm.max_map_count", "NCCL_DEBUG", "eth0", "mlx5_0:1", "550", "550.127.08-1", "12.4",
    "1g.10gb", ED25519, ED25519.rsplit(" ", 1)[0], "cramfs", "nvidia-", "4096 87380", "ib0",
    "/dev/nvme0n1", "1.17.4-1", "mirror.internal", "keys/cuda.gpg", "S4X1NA0R123456", "WARN",
    "fe80::1%ib0/64",
)  # fmt: skip
FRAGMENT = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=3),
    st.text(alphabet="abcz019.-_/:", min_size=1, max_size=4),
)


def _inserted(seed: str, at: float, part: str) -> str:
    index = int(at * len(seed))
    return seed[:index] + part + seed[index:]


@functools.cache
def valid_seeds(field: StringField) -> list[str]:
    """The seeds (and the field's defaults) that the model accepts for ``field``."""
    candidates = sorted(set(SEEDS) | set(field_defaults(field)))
    return [seed for seed in candidates if not build_desired_state(data_with(field, seed))[1]]


@functools.cache
def text_for(field: StringField) -> st.SearchStrategy[str]:
    """Valid seeds as they are, with hostile text appended, and with it inserted anywhere;
    any seed with hostile text appended."""
    seeds = st.sampled_from(valid_seeds(field) or list(SEEDS))
    any_seed = st.sampled_from(SEEDS)
    return st.one_of(
        seeds,
        st.builds(str.__add__, seeds, st.sampled_from(HOSTILE)),
        st.builds(_inserted, seeds, st.floats(0, 1), st.sampled_from(HOSTILE)),
        st.builds(lambda seed, parts: seed + "".join(parts), seeds, st.lists(FRAGMENT, max_size=3)),
        st.builds(_inserted, seeds, st.floats(0, 1), FRAGMENT),
        st.builds(
            lambda seed, parts: seed + "".join(parts), any_seed, st.lists(FRAGMENT, max_size=4)
        ),
    )


# --- the model's string fields -------------------------------------------------------------


@dataclass(frozen=True)
class StringField:
    """One place in the inventory data a string goes: a field's value, or a dict's key."""

    steps: tuple[str | int, ...]  # keys and list indexes down to the container
    owner: type  # the dataclass the field belongs to
    name: str
    kind: str  # "value", "item" (of a tuple), "dict-key", "dict-value"

    @property
    def path(self) -> str:
        text = ""
        for step in self.steps:
            text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
        return text

    def key_path(self, value: str) -> str:
        """The key path a problem for ``value`` names."""
        if self.kind == "item":
            return f"{self.path}[0]"
        if self.kind == "dict-key":
            return f"{self.path}.{value}"
        if self.kind == "dict-value":
            return f"{self.path}.{DICT_SAMPLES[self.qualified][0]}"
        return self.path

    @property
    def qualified(self) -> str:
        return f"{self.owner.__name__}.{self.name}"


def field_defaults(field: StringField) -> list[str]:
    """The field's default values and keys, valid by construction."""
    fld = {f.name: f for f in dataclasses.fields(field.owner)}[field.name]  # type: ignore[arg-type]
    if fld.default is not dataclasses.MISSING:
        default = fld.default
    elif fld.default_factory is not dataclasses.MISSING:
        default = fld.default_factory()
    else:
        return []
    if isinstance(default, str):
        return [default]
    if isinstance(default, (tuple, dict)):
        return [item for item in default if isinstance(item, str)]
    return []


def _optional_inner(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        inner = [arg for arg in get_args(tp) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def string_fields(
    cls: type = DesiredState, steps: tuple[str | int, ...] = ()
) -> Iterator[StringField]:
    hints = get_type_hints(cls)
    for fld in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = _optional_inner(hints[fld.name])
        here = (*steps, fld.name)
        origin = get_origin(tp)
        if tp is str:
            yield StringField(here, cls, fld.name, "value")
        elif origin is tuple and get_args(tp)[0] is str:
            yield StringField(here, cls, fld.name, "item")
        elif origin is tuple and dataclasses.is_dataclass(get_args(tp)[0]):
            yield from string_fields(get_args(tp)[0], (*here, 0))
        elif origin is dict and get_args(tp) == (str, str):
            yield StringField(here, cls, fld.name, "dict-key")
            yield StringField(here, cls, fld.name, "dict-value")
        elif dataclasses.is_dataclass(tp):
            yield from string_fields(tp, here)  # type: ignore[arg-type]


FIELDS = list(string_fields())

# What the data around a fuzzed field needs so that only that field can be wrong: a valid
# (key, value) for each dict field, a valid value for each required field, and the settings
# a field is only meaningful with.
DICT_SAMPLES = {
    "Kernel.sysctls": ("vm.max_map_count", "262144"),
    "Nccl.env": ("NCCL_DEBUG", "WARN"),
    "Mps.pinned_device_memory_limit": ("0", "1G"),
    "Health.actions": ("gpu.recovery_action", "reset_gpu"),
}
# Valid values for the fuzzed field's siblings (every required field among them).
SIBLING_SAMPLES: dict[str, Any] = {
    "AdminUser.name": "alice",
    "ApplicationClocks.memory_mhz": 2619,
    "ApplicationClocks.graphics_mhz": 1980,
    "FirewallRule.ports": [2049],
    "FirewallRule.sources": ["10.0.0.0/8"],
    "IpoibInterface.name": "ib0",
    "IpoibInterface.address": "192.168.100.11/24",
    "SharedMount.mount_point": "/data",
    "SharedMount.server": "nfs1.example",
    "SharedMount.export": "/export/data",
    "RegistryLogin.password_file": "keys/ngc.key",
    "RegistryMirror.registry": "docker.io",
    "RegistryMirror.mirrors": ["https://mirror.internal"],
}
# Settings elsewhere that a field is only meaningful with.
CONTEXT: dict[str, dict[str, Any]] = {
    "Repositories.direct_hosts": {"apt": {"proxy": "http://proxy:3142"}},
    "NvidiaDriver.branch": {"nvidia_driver": {"source": "nvidia"}},
    "NvidiaDriver.version": {"nvidia_driver": {"source": "debian"}},
    "Cuda.default": {"cuda": {"versions": ["12.4"]}},
    "GpuSettings.mig_layout": {"gpu_settings": {"mig": True}},
    "RegistryLogin.registry": {"container_runtime": {"engines": ["docker"]}},
    "RegistryLogin.username": {"container_runtime": {"engines": ["docker"]}},
    "RegistryLogin.password_file": {"container_runtime": {"engines": ["docker"]}},
    "RegistryMirror.registry": {"container_runtime": {"engines": ["containerd"]}},
    "RegistryMirror.mirrors": {"container_runtime": {"engines": ["containerd"]}},
}


def _required_fields(cls: type = DesiredState) -> Iterator[str]:
    hints = get_type_hints(cls)
    for fld in dataclasses.fields(cls):  # type: ignore[arg-type]
        if fld.metadata.get("required"):
            yield f"{cls.__name__}.{fld.name}"
        tp = _optional_inner(hints[fld.name])
        for inner in (tp, *get_args(tp)):
            if dataclasses.is_dataclass(inner):
                yield from _required_fields(inner)  # type: ignore[arg-type]


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def data_with(field: StringField, value: str) -> dict[str, Any]:
    """Inventory data that puts ``value`` in ``field`` and is valid everywhere else."""
    if field.kind == "item":
        leaf: Any = [value]
    elif field.kind == "dict-key":
        leaf = {value: DICT_SAMPLES[field.qualified][1]}
    elif field.kind == "dict-value":
        leaf = {DICT_SAMPLES[field.qualified][0]: value}
    else:
        leaf = value
    container: dict[str, Any] = {field.name: leaf}
    for qualified, sample in SIBLING_SAMPLES.items():
        owner, name = qualified.split(".")
        if owner == field.owner.__name__ and name != field.name:
            container[name] = sample
    data: Any = container
    for step in reversed(field.steps[:-1]):
        data = [data] if isinstance(step, int) else {step: data}
    _merge(data, CONTEXT.get(field.qualified, {}))
    return data


def accepted_value(field: StringField, state: DesiredState) -> str:
    node: Any = state
    for step in field.steps:
        node = node[step] if isinstance(step, int) else getattr(node, step)
    if field.kind in ("item", "dict-key"):
        (node,) = node
    elif field.kind == "dict-value":
        node = node[DICT_SAMPLES[field.qualified][0]]
    return str(node)


# --- what the node sees ------------------------------------------------------------------------


def _sshd(state: DesiredState, value: str) -> None:
    lines = render_sshd_config(state.sshd, DEFAULT_DISTRIBUTION).splitlines()
    baseline = render_sshd_config(DesiredState().sshd, DEFAULT_DISTRIBUTION).splitlines()
    assert len(lines) == len(baseline) + 1
    assert lines.count(f"ListenAddress {value}") == 1
    assert value.split() == [value]


def _penalty_exempt(state: DesiredState, value: str) -> None:
    from gpunode.distributions import BY_CODENAME

    lines = render_sshd_config(state.sshd, BY_CODENAME["trixie"]).splitlines()
    (exempt,) = [line for line in lines if line.startswith("PerSourcePenaltyExemptList ")]
    assert exempt.split(" ", 1)[1].split(",") == list(state.sshd.penalty_exempt_networks)
    assert value in state.sshd.penalty_exempt_networks and value.split() == [value]
    # OpenSSH 9.2 (bookworm) has no such keyword: it is never written there.
    assert not any("PerSourcePenalty" in line for line in _bookworm_sshd(state))


def _bookworm_sshd(state: DesiredState) -> list[str]:
    return render_sshd_config(state.sshd, DEFAULT_DISTRIBUTION).splitlines()


def _sysctl(state: DesiredState, value: str) -> None:
    values = sysctl_values(state)
    text = render_sysctl_conf(values)
    assert parse_sysctl_conf(text) == values
    assert len(text.splitlines()) == len(values) + 1
    for key, wanted in state.kernel.sysctls.items():
        assert shlex.split(set_command(key, wanted)) == ["sysctl", "-w", f"{key}={wanted}"]


def _nccl(state: DesiredState, value: str) -> None:
    env = state.nccl.env
    conf = render_nccl_conf(env).splitlines()[1:]
    assert [tuple(line.split("=", 1)) for line in conf] == sorted(env.items())
    profile = render_nccl_profile(env).splitlines()[1:]
    assert [shlex.split(line) for line in profile] == [
        ["export", f"{name}={env[name]}"] for name in sorted(env)
    ]


def _proxy(state: DesiredState, value: str) -> None:
    repos = state.apt
    assert repos.proxy is not None
    lines = render_proxy(repos.proxy, repos.direct_hosts).splitlines()
    assert len(lines) == 1 + len(repos.direct_hosts)
    match = re.fullmatch(r'Acquire::http::Proxy "([^"]*)";', lines[0])
    assert match is not None and match[1] == repos.proxy
    for line, name in zip(lines[1:], repos.direct_hosts, strict=True):
        match = re.fullmatch(r'Acquire::http::Proxy::([^\s"]+) "DIRECT";', line)
        assert match is not None and match[1] == name


def _sources(state: DesiredState, value: str) -> None:
    texts = [render_debian_sources(state.apt, DEFAULT_DISTRIBUTION)] + [
        repo.render_sources() for repo in nvidia_repositories_for_all(state)
    ]
    uris = [line for text in texts for line in text.splitlines() if line.startswith("URIs:")]
    written = {value, value.rstrip("/") + "/"}  # NVIDIA's flat repositories end in '/'
    assert any(line.split()[1:] in ([w] for w in written) for line in uris)
    for text in texts:
        assert all(":" in line or not line or line.startswith("#") for line in text.splitlines())


def _ubuntu_sources(state: DesiredState, value: str) -> None:
    # Both formats an Ubuntu release's archive is written in (deb822 on 24.04, one-line on
    # 22.04): the value is one URI of one entry, never a line of its own.
    deb822 = render_archive_sources(state.apt, BY_CODENAME["noble"]).splitlines()
    assert f"URIs: {value}" in deb822
    assert all(":" in line or not line or line.startswith("#") for line in deb822)
    one_line = render_archive_sources(state.apt, BY_CODENAME["jammy"]).splitlines()
    entries = [line.split() for line in one_line if not line.startswith("#")]
    assert all(len(entry) >= 5 and entry[0] == "deb" for entry in entries)
    assert any(entry[2] == value for entry in entries)


def nvidia_repositories_for_all(state: DesiredState) -> list[Any]:
    """Every repository (NVIDIA's two, the PPA), whether or not this state needs it."""
    needing = dataclasses.replace(
        state,
        cuda=dataclasses.replace(state.cuda, versions=("12.4",)),
        container_runtime=dataclasses.replace(state.container_runtime, engines=("docker",)),
    )
    return nvidia_repositories_for(needing)


def _mount_point(state: DesiredState, value: str) -> None:
    cache = state.nvme_cache
    line = fstab_line(cache, "26e5ff09-b703-4fa6-95a5-ef38156ccf8a")
    fields = line.split()
    assert len(fields) == 6 and fields[1] == value
    words = shlex.split(fstab_command(cache, line))
    assert line in words and f"mp={value}" in words
    conf = render_cachefilesd_conf(cache).splitlines()
    assert conf[1].split() == ["dir", f"{value.rstrip('/')}/fscache"]


def _ssh_key(state: DesiredState, value: str) -> None:
    # pyinfra writes each key as one authorized_keys line: it must be exactly one, the key
    # type first (no options), no blank around it.
    assert value.splitlines() == [value] and value == value.strip()
    assert value.split(" ", 1)[0] in SSH_KEY_TYPES


def _ipoib(state: DesiredState, value: str) -> None:
    (interface,) = state.infiniband.ipoib
    lines = render_ipoib(interface).splitlines()
    plain = IpoibInterface(interface.name, "192.168.100.11/24", interface.mtu)
    assert len(lines) == len(render_ipoib(plain).splitlines())
    assert lines.count(f"    address {value}") == 1 and value.split() == [value]


def _tls(state: DesiredState, value: str) -> None:
    names = wanted_certificate("node-1", state.tls).subject_alt_names().split(",")
    if value in state.tls.names:
        assert f"DNS:{value}" in names
    else:
        assert f"IP:{ipaddress.ip_address(value)}" in names


def _module(state: DesiredState, value: str) -> None:
    lines = render_module_blacklist([value]).splitlines()
    assert lines[1:] == [f"install {value} /bin/false", f"blacklist {value}"]
    assert lines[1].split() == ["install", value, "/bin/false"]


def _unattended(state: DesiredState, value: str) -> None:
    text = render_unattended_upgrades_conf(state.unattended_upgrades)
    quoted = re.findall(r'^    "([^"]*)";$', text, flags=re.MULTILINE)
    assert '"' not in value and "\\" not in value
    assert any(entry.lstrip("^").replace("\\", "") == value for entry in quoted)


def _textfile_dir(state: DesiredState, value: str) -> None:
    from roles.gpu_metrics import METRICS_FILE, render_units

    service, _ = render_units(value, state.gpu_metrics.interval_minutes)
    (exec_start,) = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    assert "%" not in value  # systemd specifiers
    assert shlex.split(exec_start)[-1] == f"{value}/{METRICS_FILE}"
    # node_exporter's $ARGS: systemd splits them at whitespace, unquoted.
    from roles.node_exporter import render_defaults

    (args,) = [
        line for line in render_defaults(9100, value).splitlines() if line.startswith("ARGS=")
    ]
    assert args.removeprefix('ARGS="').removesuffix('"').split()[-1] == (
        f"--collector.textfile.directory={value}"
    )


def _malware_scan_paths(state: DesiredState, value: str) -> None:
    import json

    from gpunode.expected.malware_scan import render_scan_config

    settings = state.audit.malware_scan
    command = json.loads(render_scan_config(settings, state.nvme_cache.mount_point))["clamscan"]
    after = command[command.index("--") + 1 :]
    if value in settings.paths:
        assert value in after  # one argument of its own, after '--'
    else:
        assert any(word.startswith("--exclude-dir=^") and word.endswith("(/|$)")
                   for word in command[: command.index("--")])  # fmt: skip


def _freshclam_url(state: DesiredState, value: str) -> None:
    from gpunode.expected.malware_scan import render_freshclam_conf

    lines = render_freshclam_conf(state.audit.malware_scan).splitlines()
    # freshclam.conf's STRING is "without blank characters": one word, one line of its own.
    assert value.split() == [value]
    assert f"PrivateMirror {value}" in lines or f"DatabaseCustomURL {value}" in lines


def _lynis_schedule(state: DesiredState, value: str) -> None:
    from gpunode.expected.lynis import render_timer_drop_in

    lines = render_timer_drop_in(value).splitlines()
    assert lines.count(f"OnCalendar={value}") == 1
    assert "%" not in value and "\n" not in value  # systemd specifiers, a second line


def _remote_syslog(state: DesiredState, value: str) -> None:
    from gpunode.expected.lynis import render_rsyslog_forward

    if not value:
        return  # empty: no forwarding (roles/lynis.py writes no file)
    (forward,) = [line for line in render_rsyslog_forward(value, 514).splitlines()
                  if not line.startswith("#")]  # fmt: skip
    assert forward.split() == ["*.*", f"@@{value}:514"]


def _prometheus_web_user(state: DesiredState, value: str) -> None:
    import yaml

    from roles.prometheus import render_host_web_config

    password_hash = "$2b$12$" + "a" * 53
    web = yaml.safe_load(render_host_web_config(value, password_hash))
    assert web["basic_auth_users"] == {value: password_hash}


def _mps_unit(state: DesiredState, value: str) -> None:
    from gpunode.expected.mps import render_unit

    unit = render_unit(state)
    environment = [line for line in unit.splitlines() if line.startswith("Environment=")]
    # One quoted NAME=value word each: no quote, space, '%' or backslash systemd would read.
    for line in environment:
        assert shlex.split(line.removeprefix("Environment=")) == [line[13:-1]]
        assert "%" not in line and "\\" not in line
    assert any(value in line for line in environment)
    if value.startswith("/"):
        assert f" {value} " in unit or f" {value}\n" in unit or f"={value}/" in unit


def _kubernetes_source(state: DesiredState, value: str) -> None:
    from roles.kubernetes import repository

    lines = repository(state).render_sources().splitlines()
    (uris,) = [line for line in lines if line.startswith("URIs: ")]
    assert uris == f"URIs: {value.rstrip('/')}/" and value.split() == [value]


def _kubernetes_version(state: DesiredState, value: str) -> None:
    from facts.container_runtime import DpkgPackageState
    from roles.kubernetes import packages_installed

    from .fakehost import commands_of

    empty = {DpkgPackageState: lambda packages: {p: {"installed": None, "held": False}
                                                 for p in packages}}  # fmt: skip
    commands, _ = commands_of(packages_installed, empty, packages=("kubelet",), version=value)
    assert shlex.split(commands[0])[-1] == f"kubelet={value}"


def _shared_mount(state: DesiredState, value: str) -> None:
    from gpunode.expected.shared_data import (
        render_automount_unit,
        render_mount_unit,
        source,
        unit_stem,
    )

    (mount,) = state.shared_data.mounts
    unit = render_mount_unit(mount)
    lines = unit.splitlines()
    # One line per key, each value as written: no '%' systemd would expand, no space.
    assert [line.split("=", 1)[0] for line in lines if "=" in line and line[0] != "#"] == [
        "Description", "Wants", "After", "What", "Where", "Type", "Options", "TimeoutSec",
    ]  # fmt: skip
    assert "%" not in unit
    what = f"What={source(mount)}"
    where = f"Where={mount.mount_point}"
    options = next(line for line in lines if line.startswith("Options="))
    assert what in lines and where in lines
    assert value in (what + where) or value in options.removeprefix("Options=").split(",")
    assert f"Where={mount.mount_point}" in render_automount_unit(mount).splitlines()
    assert "/" not in unit_stem(mount.mount_point)


def _lustre_source(state: DesiredState, value: str) -> None:
    from roles.shared_data import lustre_repository

    lines = lustre_repository(state).render_sources().splitlines()
    (uris,) = [line for line in lines if line.startswith("URIs: ")]
    assert uris == f"URIs: {value.rstrip('/')}/" and value.split() == [value]


def _registry_login(state: DesiredState, value: str) -> None:
    import base64
    import json

    from facts.registry_access import parse_registry_access
    from gpunode.expected.registry_access import render_docker_config

    (login,) = state.container_runtime.registry_logins
    text = render_docker_config([(login, "key")]).decode()
    (auth,) = json.loads(text)["auths"].items()
    assert auth[0] == login.registry
    assert base64.b64decode(auth[1]["auth"]).decode() == f"{login.username}:key"
    assert value in (login.registry, login.username)
    assert parse_registry_access(["mode 600", *text.splitlines()])["registries"] == [login.registry]


def _registry_mirror(state: DesiredState, value: str) -> None:
    import tomllib

    from gpunode.expected.registry_access import hosts_toml_path, render_hosts_toml

    (mirror,) = state.container_runtime.registry_mirrors
    hosts = tomllib.loads(render_hosts_toml(mirror))
    assert set(hosts["host"]) | {hosts["server"]} >= set(mirror.mirrors)
    assert hosts_toml_path(mirror.registry).split("/")[-2] == mirror.registry
    assert value in (mirror.registry, *mirror.mirrors)


RENDERED: dict[str, Callable[[DesiredState, str], None]] = {
    "Sshd.listen_addresses": _sshd,
    "Sshd.penalty_exempt_networks": _penalty_exempt,
    "Kernel.sysctls": _sysctl,
    "Nccl.env": _nccl,
    "Repositories.proxy": _proxy,
    "Repositories.direct_hosts": _proxy,
    "Repositories.debian_mirror": _sources,
    "Repositories.debian_security_mirror": _sources,
    "Repositories.ubuntu_mirror": _ubuntu_sources,
    "Repositories.ubuntu_security_mirror": _ubuntu_sources,
    "Repositories.ubuntu_driver_ppa_url": _sources,
    "Repositories.cuda_repo_url": _sources,
    "Repositories.container_toolkit_repo_url": _sources,
    "NvmeCache.mount_point": _mount_point,
    "AdminUser.ssh_keys": _ssh_key,
    "IpoibInterface.address": _ipoib,
    "Tls.names": _tls,
    "Tls.ip_addresses": _tls,
    "Kernel.blacklist_modules": _module,
    "UnattendedUpgrades.blacklist": _unattended,
    "GpuMetrics.textfile_dir": _textfile_dir,
    "MalwareScan.paths": _malware_scan_paths,
    "MalwareScan.exclude": _malware_scan_paths,
    "MalwareSignatures.private_mirror": _freshclam_url,
    "MalwareSignatures.custom_urls": _freshclam_url,
    "Lynis.schedule": _lynis_schedule,
    "AuditTools.remote_syslog_host": _remote_syslog,
    "Prometheus.web_user": _prometheus_web_user,
    "Mps.pipe_directory": _mps_unit,
    "Mps.log_directory": _mps_unit,
    "Mps.pinned_device_memory_limit": _mps_unit,
    "Kubernetes.repository_url": _kubernetes_source,
    "Kubernetes.version": _kubernetes_version,
    "SharedMount.mount_point": _shared_mount,
    "SharedMount.server": _shared_mount,
    "SharedMount.export": _shared_mount,
    "SharedMount.options": _shared_mount,
    "SharedData.lustre_repository_url": _lustre_source,
    "RegistryLogin.registry": _registry_login,
    "RegistryLogin.username": _registry_login,
    "RegistryMirror.registry": _registry_mirror,
    "RegistryMirror.mirrors": _registry_mirror,
}


# --- the property --------------------------------------------------------------------------


def test_the_walk_finds_the_fields_that_reach_a_node() -> None:
    found = {field.qualified for field in FIELDS}
    assert set(RENDERED) <= found
    assert {"AdminUser.name", "AdminUser.shell", "DesiredState.base_packages"} <= found
    # Every dict field and every required field has what data_with needs.
    assert {f.qualified for f in FIELDS if f.kind.startswith("dict")} == set(DICT_SAMPLES)
    assert set(_required_fields()) <= set(SIBLING_SAMPLES)


@pytest.mark.parametrize("field", FIELDS, ids=[f"{field.path}:{field.kind}" for field in FIELDS])
@FUZZ
@given(data=st.data())
def test_string_field_is_refused_or_reaches_the_node_literally(
    field: StringField, data: st.DataObject
) -> None:
    value = data.draw(text_for(field), label=field.path)
    state, problems = build_desired_state(data_with(field, value))
    where = field.key_path(value)
    ours = [p for p in problems if p.key == where or p.key.startswith((f"{where}.", f"{where}["))]
    # A refused item leaves its list shorter, which a list's own check may report too.
    others = [p for p in problems if p not in ours and not (ours and p.key == field.path)]
    assert not others, [p.render("fuzz", "node-1") for p in others]
    for problem in ours:
        assert problem.render("fuzz", "node-1").isprintable()
    if ours:
        return
    assert accepted_value(field, state) == value
    assert unprintable_character(value) is None
    check = RENDERED.get(field.qualified)
    if check is not None:
        check(state, value)


# --- operator keys prefixed x_ that reach a node: deploys/drift_timer.py -------------------
#
# build_desired_state lets x_ keys through unchecked (they are the operator's own); the one
# deploy of ours that reads some puts them into a systemd unit and an ExecStart command line.
# The deploy runs here with pyinfra's operations recorded instead of run.

DRIFT_TIMER = Path(__file__).resolve().parents[2] / "deploys" / "drift_timer.py"
X_KEYS = {
    "x_drift_inventory": "inventories/lab.py",
    "x_drift_schedule": "*-*-* 05:30:00",
    "x_drift_output_dir": "/var/lib/gpunode/drift",
    "x_drift_textfile": "/var/lib/prometheus/node-exporter/gpunode_drift.prom",
    "x_drift_drain": "critical",
    "x_drift_scheduler_ssh": "slurm@ctl.example",
}
X_SEEDS = (*X_KEYS.values(), "inventories/prod.py", "off", "ctl", "/srv/drift", "daily")


def run_drift_timer(data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The drift timer deploy with ``data``: the files it would put, by destination."""
    from pyinfra.operations import files, server, systemd

    from facts.kernel import FileModes

    from .fakehost import fake_host

    written: dict[str, str] = {}

    def put(**kwargs: Any) -> Any:
        source = kwargs["src"]
        if hasattr(source, "getvalue"):
            written[kwargs["dest"]] = source.getvalue()
        return types.SimpleNamespace(did_change=lambda: False)

    def recorded(**kwargs: Any) -> Any:
        return types.SimpleNamespace(did_change=lambda: False)

    monkeypatch.setattr(files, "put", put)
    for module, names in ((files, ("directory",)), (server, ("group", "user")),
                          (systemd, ("daemon_reload", "service"))):  # fmt: skip
        for name in names:
            monkeypatch.setattr(module, name, recorded)

    def modes(paths: list[str]) -> dict[str, dict[str, int]]:
        return {path: {"mode": 0o755} for path in paths}

    with fake_host({FileModes: modes}) as host:
        host.data = dict(data)  # type: ignore[attr-defined]
        runpy.run_path(str(DRIFT_TIMER), run_name="drift_timer_fuzz")
    return written


@pytest.fixture(scope="module")
def known_hosts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("drift-timer") / "known_hosts"
    path.write_text("ctl.example ssh-ed25519 AAAA\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("key", list(X_KEYS))
@FUZZ
@given(data=st.data())
def test_x_key_is_refused_by_name_or_reaches_the_units_literally(
    key: str, data: st.DataObject, known_hosts: str
) -> None:
    seeds = st.sampled_from(X_SEEDS)
    value = data.draw(
        st.one_of(
            seeds,
            st.builds(str.__add__, seeds, st.sampled_from(HOSTILE)),
            st.builds(_inserted, seeds, st.floats(0, 1), st.sampled_from(HOSTILE)),
            st.builds(_inserted, seeds, st.floats(0, 1), FRAGMENT),
        ),
        label=key,
    )
    given_data = {**X_KEYS, "x_drift_known_hosts": known_hosts, key: value}
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            written = run_drift_timer(given_data, monkeypatch)
        except DeployError as error:
            assert key in str(error) and str(error).isprintable(), str(error)
            return
    service = written["/etc/systemd/system/gpunode-drift.service"]
    timer = written["/etc/systemd/system/gpunode-drift.timer"]
    for line in (*service.splitlines(), *timer.splitlines()):
        assert line.isprintable(), repr(line)
    assert unprintable_character(value) is None
    (exec_start,) = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    # systemd expands % specifiers and $ variables even in quoted words.
    assert "%" not in exec_start and "$" not in exec_start
    output_dir = given_data["x_drift_output_dir"]
    expected_tail = [
        "drift", given_data["x_drift_inventory"],
        "--baseline", f"{output_dir}/latest.json", "--write-baseline", f"{output_dir}/latest.json",
        "--junit", f"{output_dir}/latest.xml", "--prometheus", given_data["x_drift_textfile"],
        *(["--drain", "critical"] if given_data["x_drift_drain"] == "critical" else []),
        *(["--scheduler-ssh", given_data["x_drift_scheduler_ssh"]]
          if given_data["x_drift_drain"] == "critical" else []),
    ]  # fmt: skip
    assert argv[1:] == expected_tail
    (read_write,) = [line for line in service.splitlines() if line.startswith("ReadWritePaths=")]
    textfile_dir = posixpath.dirname(given_data["x_drift_textfile"])
    assert read_write.removeprefix("ReadWritePaths=").split(" ") == [output_dir, textfile_dir]
    assert f"OnCalendar={given_data['x_drift_schedule']}" in timer.splitlines()
    assert "%" not in given_data["x_drift_schedule"]
