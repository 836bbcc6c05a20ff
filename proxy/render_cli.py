"""``oms-mpijob-proxy render REQUEST.json``: print what ``serve`` would submit, with no cluster.

The model is taken from the request itself (its ModelName and ModelDigest; oms is not asked).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from proxy.config import ConfigError
from proxy.configload import load_config
from proxy.stamps import StampSource, local_now
from proxy.submit.decode import ModelInfo, RunRequestError, parse_run_request
from proxy.submit.render import RenderError, Stamps, render
from proxy.submit.template import load_template
from proxy.submit.validate import choose_run_stamp, validate_run


def render_command(config_path: str | None, request_path: str) -> int:
    """Print the MPIJob (and ConfigMap) YAML; exit 1 with a message for a refused request."""
    config = load_config(config_path)
    template = load_template(config.template_path())
    try:
        body = Path(request_path).read_bytes()
    except OSError as e:
        raise ConfigError(request_path, "", f"cannot read the request: {e.strerror}") from e
    try:
        req = parse_run_request(body)
        name = req.model_name or req.model_digest
        model = ModelInfo(name=name, digest=req.model_digest or name)
        run = validate_run(req, model, config.runs)
        source = StampSource()
        now = local_now()
        submit_stamp = source.next(now)
        stamps = Stamps(
            run_stamp=choose_run_stamp(req, source, now),
            submit_stamp=submit_stamp,
            request_id="render",
            user=None,
            submitted_at=now,
        )
        rendered = render(run, model, config, template, stamps)
    except RunRequestError as e:
        print(f"{request_path}: refused ({e.status}): {e.message}", file=sys.stderr)
        return 1
    except RenderError as e:
        print(f"{request_path}: cannot render: {e}", file=sys.stderr)
        return 1
    docs = [rendered.mpijob] + ([rendered.configmap] if rendered.configmap else [])
    print(yaml.safe_dump_all(docs, sort_keys=False, width=100), end="")
    return 0
