"""One configuration source per server: every field of BrokerOptions and ControllerOptions is
a flag, a variable and a TOML key (derived from the types, so a new field cannot miss one),
filled with the precedence flag > variable > file > default."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import srtm.broker.server
import srtm.control.service
import srtm.security
from srtm.broker.options import ENV_PREFIX as BROKER_ENV
from srtm.broker.options import BrokerOptions
from srtm.cli import app
from srtm.config import Address, Setting, SettingError, read_table, resolve, setting, settings
from srtm.control.options import ENV_PREFIX as CONTROLLER_ENV
from srtm.control.options import ControllerOptions
from srtm.launch import start_controller

SERVERS = {"broker": (BrokerOptions, BROKER_ENV), "controller": (ControllerOptions, CONTROLLER_ENV)}
ALL = [(server, s) for server, (t, prefix) in SERVERS.items() for s in settings(t, prefix)]
runner = CliRunner()


def _id(case: tuple[str, Setting]) -> str:
    return f"{case[0]}-{case[1].name}"


@pytest.fixture(autouse=True)
def no_srtm_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("SRTM_")]:
        monkeypatch.delenv(var)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The options each ``srtm broker`` / ``srtm controller`` run would serve with; nothing
    is started (the token check is left out too: each test sets what it needs)."""
    seen: list[Any] = []

    async def serve(options: ControllerOptions, ready: Any) -> None:
        seen.append(options)

    monkeypatch.setattr(srtm.broker.server, "run", lambda options, ready: seen.append(options))
    monkeypatch.setattr(srtm.control.service, "serve", serve)
    monkeypatch.setattr(srtm.security, "require_auth_choice", lambda *args: None)
    yield seen


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    result = runner.invoke(app, args, env={"COLUMNS": "250", **(env or {})})
    result.flat = " ".join(result.output.split())  # rich wraps long lines
    return result


@dataclasses.dataclass
class Sample:
    """A value other than the default, as each source spells it, and the fields it sets."""

    flag_args: list[str]
    env: str
    toml: str
    fields: dict[str, Any]


def sample(s: Setting) -> Sample:
    flag = s.flags[0]
    kind = s.kind
    if kind is Address:
        return Sample([flag, "127.0.0.2:7"], "127.0.0.2:7", '"127.0.0.2:7"',
                      dict(zip(s.fields, ("127.0.0.2", 7), strict=True)))  # fmt: skip
    if kind is bool:
        if s.default:  # on unless turned off: --no-FLAG
            return Sample([f"--no-{flag[2:]}"], "0", "false", {s.name: False})
        return Sample([flag], "1", "true", {s.name: True})
    if kind is tuple:
        both = ("a:1", "http://b:2")
        return Sample([flag, both[0], flag, both[1]], " ".join(both), json.dumps(both),
                      {s.name: both})  # fmt: skip
    if issubclass(kind, enum.Enum):
        other = next(m for m in kind if m != s.default)
        return Sample([flag, other.value], other.value, json.dumps(other.value), {s.name: other})
    if kind is Path:
        return Sample([flag, "/x/y"], "/x/y", '"/x/y"', {s.name: Path("/x/y")})
    if kind is str:
        return Sample([flag, "sample"], "sample", '"sample"', {s.name: "sample"})
    lo, hi = s.spec.minimum, s.spec.maximum
    value = (lo + hi) / 2 if lo is not None and hi is not None else (s.default or 0) + 2
    value = kind(value)
    if value == s.default and hi is not None:  # a range around its default (--nice)
        value = kind(hi)
    assert value != s.default
    return Sample([flag, str(value)], str(value), repr(value), {s.name: value})


def fields_of(options: Any, names: dict[str, Any]) -> dict[str, Any]:
    return {name: getattr(options, name) for name in names}


# -- every field is a setting ----------------------------------------------------------------
@pytest.mark.parametrize("server", SERVERS)
def test_every_field_belongs_to_one_setting(server: str) -> None:
    options_type, prefix = SERVERS[server]
    covered = [f for s in settings(options_type, prefix) for f in s.fields]
    init_fields = [f.name for f in dataclasses.fields(options_type) if f.init]
    assert sorted(covered) == sorted(init_fields)
    names = [k for s in settings(options_type, prefix) for k in s.keys]
    assert len(names) == len(set(names))  # one name per setting, older names included
    envs = [v for s in settings(options_type, prefix) for v in s.env]
    assert len(envs) == len(set(envs))


def test_a_field_without_setting_metadata_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Options:
        port: int = setting(1, "A port.")
        forgotten: int = 2

    with pytest.raises(TypeError, match="forgotten"):
        settings(Options, "X_")


@pytest.mark.parametrize("server", SERVERS)
def test_help_lists_every_setting_with_its_variable(server: str) -> None:
    options_type, prefix = SERVERS[server]
    result = invoke([server, "--help"])
    assert result.exit_code == 0
    for s in settings(options_type, prefix):
        assert s.flags[0] in result.output
        assert s.env[0] in result.flat
        assert s.spec.help.split()[0] in result.flat
        if issubclass(s.kind, enum.Enum):  # its help explains each choice
            assert all(f"'{m.value}'" in result.flat for m in s.kind), s.name
    assert "--config" in result.output and "wins over the variable" in result.flat


@pytest.mark.parametrize("case", ALL, ids=_id)
def test_each_setting_is_a_flag_a_variable_and_a_key(
    case: tuple[str, Setting], started: list[Any], tmp_path: Path
) -> None:
    server, s = case
    want = sample(s)
    config = tmp_path / "c.toml"
    config.write_text(f"[{server}]\n{s.name} = {want.toml}\n")
    sources = [(want.flag_args, {}), ([], {s.env[0]: want.env}), (["--config", str(config)], {})]
    for args, env in sources:
        result = invoke([server, *args], env)
        assert result.exit_code == 0, (args, env, result.output)
        assert fields_of(started.pop(), want.fields) == want.fields, (args, env)


# -- precedence --------------------------------------------------------------------------------
def test_a_flag_wins_over_the_variable_the_variable_over_the_file(
    started: list[Any], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("mem_queue_size = 1\ntcp_address = '127.0.0.3:3'\n")  # top level
    runs = [
        ([], {}, 10_000),
        (["--config", str(config)], {}, 1),
        (["--config", str(config)], {"SRTM_MEM_QUEUE_SIZE": "2"}, 2),
        (["--config", str(config), "--mem-queue-size", "3"], {"SRTM_MEM_QUEUE_SIZE": "2"}, 3),
    ]
    for args, env, want in runs:
        assert invoke(["broker", *args], env).exit_code == 0
        options = started.pop()
        assert options.mem_queue_size == want
        assert (options.tcp_host, options.tcp_port) == (
            ("127.0.0.3", 3) if args else ("127.0.0.1", 4150)
        )


def test_an_empty_variable_counts_as_unset() -> None:
    options = resolve(BrokerOptions, BROKER_ENV, cli={}, environ={"SRTM_TOKEN": ""}, file={})
    assert options.token is None


def test_older_names_still_work_and_the_current_one_wins(
    started: list[Any], tmp_path: Path
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[broker]\nmax_output_buffer = 5\nwindow-s = 3\nheartbeat_ms = 7\n")
    assert invoke(["broker", "--config", str(config)]).exit_code == 0
    o = started.pop()
    assert (o.max_output_buffer_bytes, o.window_seconds, o.heartbeat_interval_ms) == (5, 3, 7)
    args = ["broker", "--max-output-buffer", "6", "--window-s", "4", "--heartbeat-ms", "8"]
    assert invoke(args, {"SRTM_MAX_OUTPUT_BUFFER": "9"}).exit_code == 0
    o = started.pop()
    assert (o.max_output_buffer_bytes, o.window_seconds, o.heartbeat_interval_ms) == (6, 4, 8)
    env = {"SRTM_MAX_OUTPUT_BUFFER": "9", "SRTM_MAX_OUTPUT_BUFFER_BYTES": "10"}
    assert invoke(["broker"], env).exit_code == 0
    assert started.pop().max_output_buffer_bytes == 10
    env = {"SRTM_DB": "/old.db", "SRTM_CONTROLLER_ADDRESS": "127.0.0.1:9"}
    assert invoke(["controller"], env).exit_code == 0
    o = started.pop()
    assert (o.db, o.http_port) == (Path("/old.db"), 9)


def test_a_setting_given_twice_in_a_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("max_output_buffer = 5\nmax-output-buffer-bytes = 6\n")
    with pytest.raises(SettingError, match="given twice"):
        read_table(config, "broker", BrokerOptions, BROKER_ENV)


# -- bad values name the setting where it was given ------------------------------------------
def bad_values(s: Setting) -> tuple[str | None, str]:
    """A bad value as a flag or variable would spell it (None: every string is good), and a
    bad TOML value."""
    if s.kind in (str, Path, tuple):
        return None, "5"
    bad = {Address: "nowhere", bool: "maybe", int: "1.5", float: "fast"}.get(s.kind, "bogus")
    return bad, json.dumps(bad)


@pytest.mark.parametrize("case", ALL, ids=_id)
def test_a_bad_value_in_each_source_names_the_setting(
    case: tuple[str, Setting], started: list[Any], tmp_path: Path
) -> None:
    server, s = case
    text, toml = bad_values(s)
    config = tmp_path / "bad.toml"
    config.write_text(f"[{server}]\n{s.name} = {toml}\n")
    runs = [(["--config", str(config)], {}, f"bad.toml: {s.name}")]
    if text is not None:
        runs.append(([], {s.env[0]: text}, s.env[0]))
        if s.kind is not bool:  # a flag without a value
            runs.append(([s.flags[0], text], {}, s.flags[0]))
    for args, env, named in runs:
        result = invoke([server, *args], env)
        assert result.exit_code == 2, (args, env, result.output)
        assert named in result.flat and "Invalid value" in result.flat, result.output
    assert started == []


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--broker-id", "4096"], {}, "--broker-id': 4096 is above the maximum 4095"),
        ([], {"SRTM_TRACE_SAMPLE": "-1"}, "SRTM_TRACE_SAMPLE: -1.0 is below the minimum 0"),
        (["--release-timer", "hpet"], {}, "'hpet' is not one of 'timerfd', 'asyncio'"),
    ],
)
def test_ranges_and_choices_are_checked(
    args: list[str], env: dict[str, str], message: str, started: list[Any]
) -> None:
    result = invoke(["broker", *args], env)
    assert result.exit_code == 2 and message in result.flat, result.output


@pytest.mark.parametrize("server", SERVERS)
def test_unknown_keys_are_refused_by_name(server: str, tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text(f"[{server}]\nnot_a_setting = 1\nalso-not = 2\n")
    result = invoke([server, "--config", str(config)])
    assert result.exit_code == 2 and "unknown keys also-not, not_a_setting" in result.flat


def test_the_controller_takes_its_table_from_a_shared_file(
    started: list[Any], tmp_path: Path
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(
        "[broker]\nmcap = 5.0\n\n[controller]\ntick_s = 0.5\nhttp_address = ':0'\n"
        "stale_after_s = 2.0\nadapt_settle_s = 0.0\n"
    )
    assert invoke(["controller", "--config", str(config)]).exit_code == 0
    o = started.pop()
    assert (o.tick_s, o.http_host, o.http_port) == (0.5, "127.0.0.1", 0)
    assert (o.adaptor.stale_after_s, o.adaptor.settle_s) == (2.0, 0.0)
    assert invoke(["broker", "--config", str(config)]).exit_code == 0
    assert started.pop().mcap == 5.0


def test_a_controller_started_with_config_serves_with_its_settings(tmp_path: Path) -> None:
    config = tmp_path / "controller.toml"
    config.write_text("[controller]\nmax_publishers = 2\n")
    server = start_controller(tmp_path / "c.db", ["--config", str(config)])
    try:
        pubs = [{"id": f"p{i}", "rate": 10} for i in range(3)]
        doc = {"name": "t", "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs}
        with pytest.raises(urllib.error.HTTPError) as refused:
            server.post("/topics", json.dumps(doc).encode())
        assert refused.value.code == 413
        assert "2" in json.loads(refused.value.read())["message"]
    finally:
        assert server.stop() == 0


def test_the_token_check_still_runs(tmp_path: Path) -> None:
    for server in SERVERS:
        result = invoke([server, "--http-address", "127.0.0.1:0"])
        assert result.exit_code == 2 and "--insecure-loopback" in result.flat
    result = invoke(["broker", "--tcp-address", "0.0.0.0:0", "--data-dir", str(tmp_path)],
                    {"SRTM_INSECURE_LOOPBACK": "yes"})  # fmt: skip
    assert result.exit_code == 2 and "0.0.0.0" in result.flat
