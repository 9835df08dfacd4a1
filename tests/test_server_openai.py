"""The server as real clients expect it (the official `openai` SDK, vLLM's clients, curl), over real
HTTP: OpenAI's streaming (the usage chunk only when asked), vLLM's /tokenize and /detokenize, the
model endpoints, CORS, chat templates' special tokens, every shape of chat message clients send, a
template that raises, and the field policy (minillm/server/protocol.py): nothing accepted and
silently ignored."""

import json

import httpx
import openai
import pytest

from minillm.async_engine import AsyncLLM
from minillm.engine import LLMEngine
from minillm.server import build_app
from minillm.server.chat_template import render_chat
from minillm.server.protocol import LATER_CHAT, LATER_COMPLETIONS, METADATA, NOT_YET_APPLIED, REPLACED
from tests.hf_reference import ByteTokenizer
from tests.test_server import MODEL, _config, _Server, offline, wait_idle

MAX_LEN = 128  # tests/test_server.py::_config's max_model_len
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "wx", "arguments": '{"at": "Rome"}'}}
TOOL_CHAT = [{"role": "developer", "content": "Go."}, {"role": "user", "name": "al", "content": "Wx?"},
             {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]


def char_tokenizer(template: str | None):
    """A Hugging Face tokenizer of single ASCII characters that adds a BOS (<s>, id 1) on encode, as
    Llama's does; with `template` as its chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\n": 10} | {chr(i): i for i in range(32, 127)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.chat_template = template
    return hf


LLAMA_LIKE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}"
              "{% if m.tool_calls %}[{{ m.tool_calls[0].function.name }}]{% endif %}"
              "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}: {{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def served(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, default_max_tokens=8))
    yield server, engine
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def templated(model):
    """A server whose tokenizer has a Llama-like chat template writing its own BOS."""
    engine = LLMEngine(model, char_tokenizer(LLAMA_LIKE), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, default_max_tokens=8))
    yield server, engine
    server.stop()


def post(server, path: str, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ----------------------------------------------------------------------------- A.1 streaming as OpenAI does
def test_the_sdks_common_loop_works_without_stream_options(served, client):
    """No usage chunk unless asked: `chunk.choices[0].delta` never meets an empty choices list."""
    messages = [{"role": "user", "content": "Who art thou?"}]
    text = ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                stream=True):
        text += chunk.choices[0].delta.content or ""
        assert chunk.usage is None
    assert text == offline(served[1].model, render_chat(ByteTokenizer(), messages), 10)[0]
    completion = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="ROMEO: ", max_tokens=10, temperature=0, stream=True))
    assert completion == offline(served[1].model, "ROMEO: ", 10)[0]
    wait_idle(served[1])


def test_include_usage_and_continuous_usage_stats(served, client):
    asked = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=9, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True},
                                                stream_options={"include_usage": True}))
    assert not asked[-1].choices and asked[-1].usage.completion_tokens == 9
    assert all(c.choices and c.usage is None for c in asked[:-1])
    prompt_tokens = asked[-1].usage.prompt_tokens
    continuous = list(client.completions.create(
        model=MODEL, prompt=[5, 6, 7], max_tokens=9, temperature=0, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None and c.usage.prompt_tokens == 3 for c in continuous)
    counts = [c.usage.completion_tokens for c in continuous]
    assert counts == sorted(counts) and counts[-1] == 9 and not continuous[-1].choices
    assert all(c.usage.total_tokens == 3 + c.usage.completion_tokens for c in continuous)
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert chat[0].choices[0].delta.role == "assistant" and chat[0].usage.completion_tokens == 0
    assert chat[0].usage.prompt_tokens == prompt_tokens
    wait_idle(served[1])


@pytest.mark.parametrize(("extra", "words"), [
    ({"stream_options": {"include_usage": True}}, "only allowed when stream is true"),
    ({"stream": False, "stream_options": {"include_usage": False}}, "only allowed when stream is true"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "needs stream_options.include_usage"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage must be true or false"),
    ({"stream": True, "stream_options": {"chunk_size": 4}}, "stream_options.chunk_size is not supported"),
    ({"stream": True, "stream_options": [1]}, "must be an object"),
])
def test_bad_stream_options_are_400(served, extra, words):
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi"}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})):
        error = error_of(post(served[0], path, body | extra))
        assert words in error["message"] and error["param"] == "stream_options"


# ----------------------------------------------------------------------------- A.2 endpoints
def test_tokenize_and_detokenize_have_vllms_shapes(served, client):
    server = served[0]
    answer = post(server, "/tokenize", {"model": MODEL, "prompt": "ROMEO"}).json()
    assert answer == {"count": 5, "max_model_len": MAX_LEN, "tokens": list(b"ROMEO")}
    assert post(server, "/tokenize", {"prompt": "hi", "return_token_strs": True}).json()["token_strs"] == ["h", "i"]
    messages = [{"role": "user", "content": "Who art thou?"}]
    chat = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()
    assert chat["tokens"] == list(render_chat(ByteTokenizer(), messages).encode())
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert whole.usage.prompt_tokens == chat["count"]
    opened = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert bytes(opened["tokens"]).decode() == "USER:\nWho art thou?\n\n"
    assert post(server, "/detokenize", {"model": MODEL, "tokens": list(b"ROMEO")}).json() == {"prompt": "ROMEO"}
    assert error_of(post(server, "/detokenize", {"model": MODEL, "tokens": [5, 999]}))["param"] == "tokens"
    assert error_of(post(server, "/detokenize", {"tokens": [5] * (MAX_LEN + 1)}))["param"] == "tokens"
    assert error_of(post(server, "/tokenize", {"model": "gpt-4", "prompt": "hi"}), 404)["code"] == "model_not_found"
    assert error_of(post(server, "/tokenize", {"prompt": "hi", "bogus": 1}))["param"] == "bogus"
    assert error_of(post(server, "/tokenize", {"messages": messages, "tools": [{"type": "function"}]}))[
        "param"] == "tools"
    both = {"messages": messages, "add_generation_prompt": True, "continue_final_message": True}
    assert error_of(post(server, "/tokenize", both))["param"] == "continue_final_message"


def test_models_health_and_the_sdks_models_retrieve(served, client):
    server = served[0]
    listed = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"], m["object"]) for m in listed] == [(MODEL, MAX_LEN, "model")]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4")
    assert caught.value.body["code"] == "model_not_found" and "gpt-4" in caught.value.body["message"]
    assert [m.id for m in client.models.list()] == [MODEL]
    head = httpx.head(server.url + "/health")
    assert head.status_code == 200 and head.content == b""
    assert error_of(httpx.get(server.url + "/v1/completions"), 405)["type"] == "invalid_request_error"


def test_cors_is_opt_in_and_answers_a_preflight_before_the_key_check(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    llm = AsyncLLM(engine=engine)
    servers = {"off": _Server(build_app(llm, MODEL)),
               "on": _Server(build_app(llm, MODEL, api_key="sesame", cors_origins=["http://app.example"]))}
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    try:
        answer = httpx.options(servers["on"].url + "/v1/completions", headers=preflight)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "http://app.example"
        refused = httpx.get(servers["on"].url + "/v1/models", headers={"Origin": "http://app.example"})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.options(servers["on"].url + "/v1/completions", headers=preflight | {"Origin": "http://evil"})
        assert "access-control-allow-origin" not in other.headers
        plain = httpx.get(servers["off"].url + "/v1/models", headers={"Origin": "http://app.example"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    finally:
        for server in servers.values():
            server.stop()


# ----------------------------------------------------------------------------- A.3 special tokens, default lengths
def test_a_template_that_writes_its_bos_gets_one_bos(templated):
    server = templated[0]
    messages = [{"role": "user", "content": "hi"}]
    chat = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()["tokens"]
    assert chat[0] == 1 and chat[1] != 1 and chat.count(1) == 1  # the template's BOS, none added again
    answer = post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2}).json()
    assert answer["usage"]["prompt_tokens"] == len(chat)
    asked = post(server, "/tokenize", {"messages": messages, "add_special_tokens": True}).json()["tokens"]
    assert asked[:2] == [1, 1]  # asked for: the tokenizer's BOS on top of the template's
    assert post(server, "/tokenize", {"prompt": "hi"}).json()["tokens"] == [1, 104, 105]  # completions: added
    completion = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}).json()
    assert completion["usage"]["prompt_tokens"] == 3
    bare = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                            "add_special_tokens": False}).json()
    assert bare["usage"]["prompt_tokens"] == 2
    wait_idle(templated[1])


def test_chat_defaults_to_the_rest_of_the_context_and_completions_to_default_max_tokens(served):
    server = served[0]
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                                 "ignore_eos": True, "temperature": 0}).json()
    assert chat["usage"]["completion_tokens"] == MAX_LEN - chat["usage"]["prompt_tokens"]
    assert chat["choices"][0]["finish_reason"] == "length"
    completion = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "ignore_eos": True}).json()
    assert completion["usage"]["completion_tokens"] == 8  # build_app(default_max_tokens=8)
    wait_idle(served[1])


# ----------------------------------------------------------------------------- B.4 chat messages clients send
def test_every_message_shape_clients_send_is_served(served, client):
    server = served[0]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Who art"}, {"type": "text", "text": "thou?"}]}]
    joined = [{"role": "user", "content": "Who art\nthou?"}]
    assert post(server, "/tokenize", {"messages": parts}).json() == post(server, "/tokenize",
                                                                          {"messages": joined}).json()
    developer = post(server, "/tokenize", {"messages": [{"role": "developer", "content": "Be terse."}]}).json()
    system = post(server, "/tokenize", {"messages": [{"role": "system", "content": "Be terse."}]}).json()
    assert developer == system
    answer = client.chat.completions.create(model=MODEL, messages=TOOL_CHAT, max_tokens=3)
    assert answer.choices[0].message.role == "assistant"
    rendered = bytes(post(server, "/tokenize", {"messages": TOOL_CHAT}).json()["tokens"]).decode()
    assert rendered == ('SYSTEM:\nGo.\n\nUSER (al):\nWx?\n\n'
                        'ASSISTANT:\n{"name": "wx", "arguments": {"at": "Rome"}, "id": "c1"}\n\n'
                        'TOOL (c1):\n18 C\n\nASSISTANT:\n')
    echoed = {"role": "assistant", "content": "Hi", "refusal": None, "audio": None, "function_call": None,
              "tool_calls": None, "annotations": []}  # a pydantic dump of an earlier answer
    assert post(server, "/tokenize", {"messages": [echoed]}).status_code == 200
    opened = post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"},
                                                     {"role": "assistant", "content": "Well,"}],
                                        "continue_final_message": True}).json()
    assert bytes(opened["tokens"]).decode().endswith("ASSISTANT:\nWell,")
    wait_idle(served[1])


def test_a_template_gets_the_messages_as_they_are(templated):
    rendered = post(templated[0], "/tokenize", {"messages": TOOL_CHAT}).json()["tokens"]
    text = templated[1].tokenizer.decode(rendered)
    assert text == "<s>system: Go.\nuser: Wx?\nassistant[wx]: \ntool(c1): 18 C\nassistant:", text


@pytest.mark.parametrize(("message", "words"), [
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}, "'image_url' part"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "'input_audio' part"),
    ({"role": "user", "content": [{"text": "no type"}]}, "must be {'type': 'text'"),
    ({"role": "user", "content": None}, "content must be a string"),
    ({"role": "assistant", "content": None}, "content must be a string"),
    ({"role": "tool", "content": "18 C"}, "tool_call_id"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}, "tool_calls[0] must be"),
    ({"role": "user", "content": "hi", "tool_calls": [TOOL_CALL]}, "tool_calls is not supported"),
    ({"role": "assistant", "content": "hi", "refusal": "no"}, "refusal is not supported"),
    ({"role": "user", "content": "hi", "name": 5}, "name must be a string"),
    ({"role": "function", "content": "hi"}, "role in system, developer, user, assistant, tool"),
])
def test_bad_messages_are_400_naming_the_problem(served, message, words):
    error = error_of(post(served[0], "/v1/chat/completions", {"model": MODEL, "messages": [message]}))
    assert words in error["message"] and error["param"] == "messages"


# ----------------------------------------------------------------------------- B.5 templates that raise
@pytest.mark.parametrize(("template", "words"), [
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}", "roles must alternate"),
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "the model's chat template failed"),
    ("{% for m in messages %}", "the model's chat template failed"),
])
def test_a_template_that_raises_is_a_400_naming_its_message(model, template, words):
    engine = LLMEngine(model, char_tokenizer(template), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL))
    calls = []
    retrying = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=2,
                             http_client=httpx.Client(event_hooks={"request": [calls.append]}))
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            retrying.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert words in caught.value.body["message"] and caught.value.body["param"] == "messages"
        assert len(calls) == 1  # a 400 is not retried (a 500 would have been, twice)
        assert error_of(post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}))
    finally:
        server.stop()


# ----------------------------------------------------------------------------- C.6 the field policy
NON_NEUTRAL = {"tools": [{"type": "function"}], "tool_choice": "auto",  # the tool fields: on completions
               "parallel_tool_calls": True, "guided_json": {}, "guided_regex": "a+", "guided_choice": ["a"],
               "guided_grammar": "root ::= 'a'", "best_of": 2, "suffix": "end",
               "functions": [{"name": "f"}], "function_call": "auto", "audio": {"voice": "alloy"},
               "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
               "reasoning_effort": "low", "web_search_options": {}, "chat_template": "{{ 1 }}",
               "chat_template_kwargs": {"a": 1}, "documents": [{"text": "x"}], "echo": True}
NEUTRAL = {"tools": [[], None],
           "tool_choice": ["none"], "parallel_tool_calls": [None], "guided_json": [None], "guided_regex": [None],
           "guided_choice": [None], "guided_grammar": [None], "best_of": [1],
           "suffix": ["", None], "functions": [[]], "function_call": ["none"], "audio": [None],
           "modalities": [["text"]], "prediction": [None], "reasoning_effort": [None], "web_search_options": [None],
           "chat_template": [None], "chat_template_kwargs": [{}], "documents": [None], "echo": [False, None]}
CHAT_NOT_YET = {"echo"}  # vLLM's chat echo (completions apply echo)


def _endpoints(name: str):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    completion = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    if name in NOT_YET_APPLIED or name in REPLACED or name in (set(LATER_CHAT) & set(LATER_COMPLETIONS)):
        return [("/v1/completions", completion), ("/v1/chat/completions", chat)]
    return [("/v1/completions", completion)] if name in LATER_COMPLETIONS else [("/v1/chat/completions", chat)]


def test_the_tables_are_what_this_test_covers():
    assert not NOT_YET_APPLIED  # every sampling field clients send is applied now
    assert set(NON_NEUTRAL) == set(NEUTRAL) == set(LATER_CHAT) | set(LATER_COMPLETIONS) | set(REPLACED) | CHAT_NOT_YET


@pytest.mark.parametrize("name", sorted(NON_NEUTRAL))
def test_a_field_not_applied_is_refused_unless_neutral(served, name):
    for path, body in _endpoints(name):
        error = error_of(post(served[0], path, body | {name: NON_NEUTRAL[name]}))
        assert error["param"] == name and f"{name} is not supported by this server" in error["message"]
        for value in NEUTRAL[name]:
            response = post(served[0], path, body | {name: value})
            assert response.status_code == 200, (path, name, value, response.text)
    wait_idle(served[1])


def test_logprobs_are_shaped_per_endpoint(served):
    """Chat: logprobs true/false and top_logprobs (which needs logprobs); completions: a number, 0 being the
    chosen token's logprob alone (not 'no logprobs'); false is no number."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert post(served[0], "/v1/chat/completions", chat | {"logprobs": False}).json()["choices"][0]["logprobs"] is None
    content = post(served[0], "/v1/chat/completions", chat | {"logprobs": True}).json()["choices"][0]["logprobs"]
    assert len(content["content"]) == 2 and all(item["top_logprobs"] == [] for item in content["content"])
    assert error_of(post(served[0], "/v1/chat/completions", chat | {"top_logprobs": 2}))["param"] == "top_logprobs"
    completion = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    zero = post(served[0], "/v1/completions", completion | {"logprobs": 0}).json()["choices"][0]["logprobs"]
    assert len(zero["token_logprobs"]) == 2 and all(len(top) == 1 for top in zero["top_logprobs"])
    for value in (False, 1.5, 21, -1):
        assert error_of(post(served[0], "/v1/completions", completion | {"logprobs": value}))["param"] == "logprobs"
    wait_idle(served[1])


def test_metadata_fields_are_accepted_and_checked(served, client):
    values = {"user": "u-1", "metadata": {"run": "a"}, "store": False, "service_tier": "auto",
              "safety_identifier": "s", "prompt_cache_key": "k"}
    assert set(values) == set(METADATA)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                            **values)
    assert answer.usage.completion_tokens >= 1
    for name in METADATA:
        error = error_of(post(served[0], "/v1/completions", {"model": MODEL, "prompt": "hi", name: 5}))
        assert error["param"] == name
    wait_idle(served[1])


def test_unknown_fields_are_refused_by_name(served):
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi"}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})):
        error = error_of(post(served[0], path, body | {"temprature": 0.5}))
        assert error["param"] == "temprature" and "refuses fields it does not know" in error["message"]
    only_chat = {"model": MODEL, "prompt": "hi", "max_completion_tokens": 3}
    assert error_of(post(served[0], "/v1/completions", only_chat))["param"] == "max_completion_tokens"


def test_stop_token_ids_are_applied(model, served):
    _, tokens = offline(model, [5, 6, 7], 12)
    index = next(i for i, t in enumerate(tokens) if t not in tokens[:i] and i >= 2)
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0,
            "stop_token_ids": [tokens[index]]}
    answer = post(served[0], "/v1/completions", body).json()
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == index + 1
    for bad in ([256], [-1], "5", [1.5]):
        assert error_of(post(served[0], "/v1/completions", body | {"stop_token_ids": bad}))["param"] == \
            "stop_token_ids"
    wait_idle(served[1])


def test_the_streamed_events_are_json_lines_an_sse_parser_reads(served):
    """curl's view: `data: {json}` lines and a last `data: [DONE]`."""
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", served[0].url + "/v1/completions", json=body, timeout=30) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    assert all(json.loads(line[6:])["choices"] for line in lines[:-1])
    wait_idle(served[1])
