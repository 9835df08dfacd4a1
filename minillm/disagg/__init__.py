"""Prefill/decode disaggregation (chapter 13): a prefill engine and a decode engine in processes of their own.

    kv_connector.py   how a prompt's K/V travel from one engine's blocks to the other's
    router.py         DisaggregatedLLM: AsyncLLM's API, each request sent to both cores in turn
"""
