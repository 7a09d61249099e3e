"""`dflash serve`'s /metrics text (written by prometheus_client) and the remote engine's reading of a
server's metrics (prometheus_client's parser): label values that need escaping survive both ways."""

from prometheus_client.parser import text_string_to_metric_families

from dflash_tui.engines.remote.client import parse_prometheus
from dflash_tui.serve.metrics import Metrics


def test_a_served_name_with_quotes_and_backslashes_keeps_the_text_parseable():
    name = 'my "best" model\\v2\nnext'
    metrics = Metrics(name, block_size=4)
    metrics.request("/v1/chat/completions", 200)
    metrics.first_token(0.03)
    for accepted in (3, 1, 0):
        metrics.step(drafted=3, accepted=accepted, emitted=accepted + 1, prefill=False)
    metrics.finish("stop", prompt_tokens=10)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    requests = families["dflash:requests"].samples[0]
    assert requests.labels == {"model_name": name, "route": "/v1/chat/completions", "status": "200"}
    acceptance = {s.name: s for s in families["dflash:acceptance_length"].samples if s.labels.get("le") in (None, "+Inf")}
    assert acceptance["dflash:acceptance_length_count"].value == 3 and acceptance["dflash:acceptance_length_sum"].value == 4 + 2 + 1
    parsed = parse_prometheus(metrics.render())
    assert parsed["dflash:spec_decode_num_accepted_tokens_total"] == 4 and parsed["dflash:generation_tokens_total"] == 7


def test_the_reader_sums_label_sets_and_survives_escaped_labels():
    text = ('# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="a \\"b\\""} 2\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="a,b"} 3\n')
    assert parse_prometheus(text)["vllm:spec_decode_num_drafts_total"] == 5
