"""docs/gateways.md's SGLang Model Gateway, vLLM router and LiteLLM configurations are ones the agent
and the callback accept as the page says."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest
import yaml

from agent.__main__ import build_applier, build_parser
from agent.litellm_callback import parse_groups
from agent.smg import SmgApplier
from agent.vllm_router import VllmRouterApplier
from tests.test_compose import ROOT

DOC = (ROOT / "docs" / "gateways.md").read_text()


def section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def agent_command(title: str) -> list[str]:
    """The section's ``outlier-agent ...`` command as argv (continuation lines joined)."""
    text = section(title).replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("outlier-agent "))
    return shlex.split(line.strip().replace('"$SMG_ADMIN_KEY"', "key"))[1:]


@pytest.mark.parametrize("title,cls", [("SGLang Model Gateway", SmgApplier), ("vLLM router", VllmRouterApplier)])
def test_agent_command_of_the_page(title: str, cls: type) -> None:
    args = build_parser().parse_args(agent_command(title))
    applier = build_applier(args)
    assert isinstance(applier, cls) and applier.name == args.gateway
    # The router's --worker-urls of the page are the agent's --router-workers.
    router = section(title).replace("\\\n", " ")
    urls = re.search(r"--worker-urls ((?:http://\S+ )+)", router).group(1).split()
    assert sorted(applier.known.values()) == sorted(urls)


def test_litellm_yaml_of_the_page() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", section("LiteLLM"), re.S)
    assert len(blocks) == 1
    config = yaml.safe_load(blocks[0])
    (path,) = config["litellm_settings"]["callbacks"]
    module, _, name = path.rpartition(".")
    callback = getattr(importlib.import_module(module), name)
    assert callable(callback.async_filter_deployments)
    groups = parse_groups(config["environment_variables"]["OUTLIER_LITELLM_GROUPS"])
    assert set(groups) == {d["model_name"] for d in config["model_list"]}
    assert all(d["litellm_params"]["api_base"].startswith("http://") for d in config["model_list"])
