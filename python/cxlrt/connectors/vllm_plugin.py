"""vLLM general plugin (entry point group `vllm.general_plugins`, declared
in python/pyproject.toml): registers the KV connector with vLLM's
KVConnectorFactory under the name "CxlrtConnector", so that an installed
cxlrt is named without a module path:

    --kv-transfer-config '{"kv_connector": "CxlrtConnector", "kv_role": "kv_both"}'

vLLM calls `register` in every process it starts, possibly more than once;
the connector's module (and so the store) is imported only when vLLM makes
the connector.
"""

from __future__ import annotations

CONNECTOR_NAME = "CxlrtConnector"


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, "cxlrt.connectors.vllm",
                                              "CxlrtConnector")
    except ValueError:
        pass  # registered already: vLLM loads its plugins once per process, or more
