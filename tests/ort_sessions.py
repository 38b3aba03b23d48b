"""What an ONNX Runtime session of the runtime was opened with."""

from __future__ import annotations


def prepacks(backend, graph: str) -> bool:
    """Whether ``backend``'s session of ``graph`` packs its MatMul weights (``session.disable_prepacking`` unset)."""
    options = backend._session(graph).get_session_options()
    try:
        return options.get_session_config_entry("session.disable_prepacking") != "1"
    except Exception:  # onnxruntime raises when the entry was never set: the default, prepacking on
        return True


# ONNX Runtime 1.32 keeps its telemetry off by itself when one of these is set (read from the names in its library next
# to the telemetry code, and tried: GITHUB_ACTIONS=true or CI=true with ORT_DISABLE_TELEMETRY=0 writes nothing). Plain
# CI has no string of its own there (the linker keeps it as the tail of GITLAB_CI), so it was found by trying each tail
# of those names; no other tail turns telemetry off. CI machines set one, so a check that telemetry comes back when
# asked for must not pass them on.
CI_MARKERS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL", "CODEBUILD_BUILD_ID",
              "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER")  # fmt: skip


def telemetry_env(environ, home, setting: str | None) -> dict:
    """``environ`` for a child under an empty ``home``, with ORT_DISABLE_TELEMETRY as ``setting`` (None: unset) and no
    CI marker, so ONNX Runtime's own default (telemetry on) is what the project has to turn off."""
    drop = {"ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME", *CI_MARKERS}
    env = {k: v for k, v in environ.items() if k not in drop} | {"HOME": str(home)}
    if setting is not None:
        env["ORT_DISABLE_TELEMETRY"] = setting
    return env
