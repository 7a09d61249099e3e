"""`dflash serve`: one engine behind the OpenAI API (starlette on uvicorn, SSE streaming).

`app` shapes requests and responses, `worker` runs the engine one request at a time behind a bounded
queue, `metrics` renders Prometheus text, `run` starts it all, `launch` prints vLLM / SGLang launch
commands for a profile, `cli` holds the click commands. The client side is `engines.remote`.
"""
