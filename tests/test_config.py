"""Configuration: validation messages name the file and key; docs stay in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import Config, ConfigError
from proxy.configdoc import example_yaml, markdown_reference
from proxy.configload import Overrides, apply_overrides, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"oms": {"url": "ftp://oms"}}, "oms.url", "http:// or https://"),
        ({"oms": {"url": "http://oms:4040/api"}}, "oms.url", "without path"),
        ({"oms": {"url": "http://oms:99999"}}, "oms.url", "bad port"),
        ({"oms": {"urll": "http://x"}}, "oms.urll", "unknown key"),
        ({"serverr": {}}, "serverr", "unknown key"),
        ({"server": {"port": "80"}}, "server.port", "expected an integer"),
        ({"server": {"port": True}}, "server.port", "expected an integer"),
        ({"server": {"port": 70000}}, "server.port", "0..65535"),
        (
            {"server": {"max_request_target_bytes": 100}},
            "server.max_request_target_bytes",
            ">= 256",
        ),
        ({"server": {"max_header_bytes": 0}}, "server.max_header_bytes", ">= 256"),
        ({"server": {"max_headers": 0}}, "server.max_headers", ">= 1"),
        ({"oms": {"max_answer_head_bytes": 10}}, "oms.max_answer_head_bytes", ">= 1024"),
        ({"oms": {"max_answer_headers": 0}}, "oms.max_answer_headers", ">= 1"),
        ({"runs": {"intercept": "some"}}, "runs.intercept", "one of 'mpi', 'all', 'none'"),
        ({"runs": {"allowed_env": ["LD_PRELOAD"]}}, "runs.allowed_env[0]", "never allowed"),
        ({"runs": {"allowed_env": "TZ"}}, "runs.allowed_env", "a list of a string"),
        ({"runs": {"allowed_opts_patterns": ["("]}}, "runs.allowed_opts_patterns[0]", "regular"),
        ({"kubernetes": {"namespace": "Bad_NS"}}, "kubernetes.namespace", "DNS-1123"),
        ({"mpijob": {"memory_per_process": "lots"}}, "mpijob.memory_per_process", "quantity"),
        ({"mpijob": {"models_bin_dir": "models/bin"}}, "mpijob.models_bin_dir", "absolute"),
        ({"server": []}, "server", "expected a mapping"),
    ],
)
def test_bad_values_name_file_key_and_expectation(data: object, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "site.yaml")
    assert info.value.source == "site.yaml"
    assert info.value.key == key
    assert fragment in info.value.problem
    assert str(info.value).startswith(f"site.yaml: {key}: ")


def test_defaults_without_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMS_MPIJOB_PROXY_CONFIG", raising=False)
    config = load_config(None)
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 8080
    assert config.oms.url == "http://127.0.0.1:4040"
    assert config.runs.intercept == "mpi"
    assert config.template_path().is_file()


def test_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("server:\n  port: 9999\n")
    monkeypatch.setenv("OMS_MPIJOB_PROXY_CONFIG", str(f))
    assert load_config(None).server.port == 9999


def test_yaml_errors_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_win_and_are_validated() -> None:
    config = apply_overrides(
        Config(),
        Overrides(
            host="127.0.0.1",
            port=1234,
            oms_url="http://oms:4040",
            namespace="runs",
            log_level="debug",
        ),
    )
    assert (config.server.host, config.server.port) == ("127.0.0.1", 1234)
    assert config.oms.url == "http://oms:4040"
    assert config.kubernetes.namespace == "runs"
    assert config.logging.level == "DEBUG"
    with pytest.raises(ConfigError, match=r"oms\.url"):
        apply_overrides(Config(), Overrides(oms_url="not a url"))
    with pytest.raises(ConfigError, match=r"logging\.level"):
        apply_overrides(Config(), Overrides(log_level="loud"))


def test_example_config_is_generated_and_loads_to_defaults() -> None:
    path = ROOT / "config" / "proxy.yaml"
    assert path.read_text() == example_yaml(), "regenerate: python tools/regen_config_docs.py"
    config = load_config(path)
    for section in ("server", "oms", "kubernetes", "runs", "mpijob", "follow", "logging"):
        assert getattr(config, section) == getattr(Config(), section)


def test_readme_documents_every_key() -> None:
    readme = (ROOT / "README.md").read_text()
    assert markdown_reference() in readme


def test_check_config_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(f"mpijob:\n  template: {ROOT / 'config' / 'mpijob-template.yaml'}\n")
    assert main(["check-config", "--config", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("oms:\n  url: nope\n")
    assert main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: oms.url: expected an http:// or https:// URL" in err


def test_python_dash_m_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "routes"], capture_output=True, text=True, check=True
    )
    assert "/api/run" in out.stdout


def test_check_config_rejects_a_template_typo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server would silently drop an unknown field: check-config names it instead."""
    text = (ROOT / "config" / "mpijob-template.yaml").read_text()
    assert "tolerations:" in text
    template = tmp_path / "mpijob-template.yaml"
    template.write_text(text.replace("tolerations:", "tolerationz:", 1))
    config = tmp_path / "proxy.yaml"
    config.write_text("mpijob:\n  template: mpijob-template.yaml\n")
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert str(template) in err
    assert "tolerationz" in err
