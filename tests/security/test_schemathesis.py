"""Issue 9 acceptance: schemathesis against a live daphne server, as two roles, every phase
(examples, coverage, fuzzing, stateful): no server error and no response that disagrees with the schema.

Bounded: VOLT_SCHEMATHESIS_MAX_EXAMPLES (default 6) cases per operation and phase, no shrinking, one
worker (Hypothesis's lambda introspection is not thread-safe), a per-request timeout, and a hard limit
on each run. A failure prints schemathesis's report (each case with a curl line to reproduce it).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.security.live_api import BIN, REPO_ROOT, live_api

pytestmark = pytest.mark.integration

ROLES = ("alice", "priya")  # a researcher of a team; a provider admin of another organisation
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
RUN_LIMIT_S = 540


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with live_api(tmp_path_factory.mktemp("schemathesis"), ROLES) as server:
        yield server


@pytest.mark.parametrize("role", ROLES)
def test_api_has_no_server_error_and_keeps_to_its_schema(api, role, tmp_path):
    max_examples = os.environ.get("VOLT_SCHEMATHESIS_MAX_EXAMPLES", "6")
    command = [
        str(BIN / "st"),
        "run",
        f"{api.url}/api/schema/",
        "--header",
        f"Authorization: Bearer {api.tokens[role]}",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--checks",
        ",".join(CHECKS),
        "--max-examples",
        max_examples,
        "--seed",
        os.environ.get("VOLT_SCHEMATHESIS_SEED", "1"),
        "--no-shrink",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        # Revoking the run's own token would leave every later request a 401 (the matrix test covers
        # revoke's authorization; test_tokens_and_auth its behaviour).
        "--exclude-path-regex",
        r"/tokens/\{id\}/revoke/",
        "--no-color",
        "--output-truncate",
        "true",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    env = os.environ | {"SCHEMATHESIS_HOOKS": ""}
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"schemathesis ran past {RUN_LIMIT_S} s:\n{(exc.stdout or '')[-6000:]}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"schemathesis as {role} found problems:\n{output[-15000:]}\n{api.log_tail()}"
    )
    assert "Tested: 0" not in output
