"""The policy server over real HTTP on 127.0.0.1: token-exact turns, logprobs, validation, concurrency, shutdown."""

import asyncio
import copy
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from gym_fakes import ScriptedGenerator, policy_server_of
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.policy_server_runner import PolicyServer, listening_socket
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

MAX_MODEL_LEN = 512
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


class CountingGenerator:
    """Passes submits through to an HFGenerator and counts them (tests wait until all requests are queued)."""

    def __init__(self, engine: HFGenerator) -> None:
        self.engine = engine
        self.num_submitted = 0
        self.all_submitted = threading.Event()
        self.expected = 0

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        future = self.engine.submit(request)
        self.num_submitted += 1  # handlers run on the one event-loop thread, so no lock is needed
        if self.num_submitted >= self.expected > 0:
            self.all_submitted.set()
        return future


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


@pytest.fixture(scope="module")
def served(policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple[str, CountingGenerator]]:
    """(root URL, generator) of a server over a real HFGenerator on the tiny model."""
    engine = HFGenerator(policy, [EOS_TOKEN_ID], PAD_TOKEN_ID, 64, "cpu", seed=0, max_context_length=MAX_MODEL_LEN)
    generator = CountingGenerator(engine)
    with policy_server_of(generator, tokenizer, MAX_MODEL_LEN) as server:
        yield server.url.removesuffix("/v1"), generator
    engine.close()


def chat(root: str, history: list[dict], **overrides: object) -> httpx.Response:
    body = {"model": "policy", "messages": history, "tools": TOOLS, "temperature": 1.0, "top_p": 1.0}
    body |= {"max_tokens": 6, "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True} | overrides
    return httpx.post(f"{root}/v1/chat/completions", json=body, timeout=60)


def test_two_turn_tool_conversation_keeps_a_token_exact_history(served: tuple[str, CountingGenerator]) -> None:
    root, _ = served
    first = chat(root, [{"role": "user", "content": "Weather in Paris?"}])
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    # The agent sends the turn back as it came (token fields included) and adds its tool result.
    assistant = {"role": "assistant", **message}
    assistant.setdefault(
        "tool_calls",
        [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    )
    messages = [{"role": "user", "content": "Weather in Paris?"}, assistant]
    messages.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "21 C"})
    second = chat(root, messages)
    assert second.status_code == 200, second.text
    seen = message["prompt_token_ids"] + message["generation_token_ids"]
    assert second.json()["choices"][0]["message"]["prompt_token_ids"][: len(seen)] == seen


def test_generation_logprobs_match_a_recompute(served: tuple[str, CountingGenerator], policy: PreTrainedModel) -> None:
    root, _ = served
    response = chat(root, [{"role": "user", "content": "What is 2+3?"}], max_tokens=8)
    body = response.json()
    message = body["choices"][0]["message"]
    prompt, generated = message["prompt_token_ids"], message["generation_token_ids"]
    assert len(message["generation_log_probs"]) == len(generated) == body["usage"]["completion_tokens"]
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        expected = token_logprobs(policy, ids, torch.ones_like(ids), temperature=1.0)[0, len(prompt) :]
    torch.testing.assert_close(torch.tensor(message["generation_log_probs"]), expected, atol=1e-5, rtol=0)


def test_validation_profile_decodes_greedily(served: tuple[str, CountingGenerator]) -> None:
    root, _ = served
    answers = [chat(root, [{"role": "user", "content": "hi"}], temperature=0.0).json() for _ in range(2)]
    ids = [answer["choices"][0]["message"]["generation_token_ids"] for answer in answers]
    assert ids[0] == ids[1]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            {"temperature": 0.7},
            "matches no sampling profile: train (temperature, top_p) = (1.0, 1.0), validation = (0.0",
        ),
        ({"top_p": None}, "must both be set explicitly"),
        ({"top_k": 5}, "top_k=5 is not allowed"),
        ({"stop": ["\n"]}, "stop=['\\n'] is not supported"),
        ({"n": 2}, "only n=1"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"messages": [{"role": "user", "content": "x " * 600}]}, "maximum context length is 512"),
    ],
)
def test_rule_violations_get_400_with_the_reason(
    served: tuple[str, CountingGenerator], overrides: dict, fragment: str
) -> None:
    root, _ = served
    response = chat(root, [{"role": "user", "content": "hi"}], **overrides)
    assert response.status_code == 400
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error" and error["code"] == 400


def test_over_long_prompt_message_names_the_context_length(served: tuple[str, CountingGenerator]) -> None:
    response = chat(served[0], [{"role": "user", "content": "x " * 600}])
    assert "context length" in response.json()["error"]["message"]  # agents end the rollout gracefully on it


def test_top_k_minus_one_and_unknown_model(served: tuple[str, CountingGenerator]) -> None:
    root, _ = served
    assert chat(root, [{"role": "user", "content": "hi"}], top_k=-1).status_code == 200
    assert chat(root, [{"role": "user", "content": "hi"}], model="other").status_code == 404


def test_concurrent_requests_share_one_engine_batch(served: tuple[str, CountingGenerator]) -> None:
    root, generator = served
    num_requests = 6
    generator.engine.pause()  # hold the engine until every request is queued, so they must share a batch
    generator.expected = generator.num_submitted + num_requests
    generator.all_submitted.clear()
    with ThreadPoolExecutor(num_requests) as pool:
        futures = [pool.submit(chat, root, [{"role": "user", "content": f"q{i}"}]) for i in range(num_requests)]
        assert generator.all_submitted.wait(30)
        generator.engine.resume()
        statuses = [future.result().status_code for future in futures]
    assert statuses == [200] * num_requests
    assert generator.engine.stats().largest_batch_size >= num_requests


def test_tokenize_models_and_health(served: tuple[str, CountingGenerator], tokenizer: PreTrainedTokenizerBase) -> None:
    root, _ = served
    messages = [{"role": "user", "content": "hi"}]
    tokens = httpx.post(f"{root}/tokenize", json={"model": "policy", "messages": messages}).json()
    prompt = chat(root, messages, tools=None).json()["choices"][0]["message"]["prompt_token_ids"]
    assert tokens["tokens"] == prompt and tokens["count"] == len(prompt) and tokens["max_model_len"] == MAX_MODEL_LEN
    plain = httpx.post(f"{root}/tokenize", json={"prompt": "hello"}).json()["tokens"]
    assert plain == list(tokenizer.encode("hello", add_special_tokens=False))
    assert httpx.post(f"{root}/tokenize", json={"prompt": "a", "bogus": 1}).status_code == 422
    assert httpx.get(f"{root}/v1/models").json()["data"][0]["id"] == "policy"
    assert httpx.get(f"{root}/health").json() == {"status": "ok"}


def scripted_server(
    tokenizer: PreTrainedTokenizerBase, generator: ScriptedGenerator, **options: object
) -> PolicyServer:
    return policy_server_of(generator, tokenizer, **({"max_model_len": MAX_MODEL_LEN} | options))


def test_generated_tool_call_is_parsed_and_max_tokens_clamped(tokenizer: PreTrainedTokenizerBase) -> None:
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call><|im_end|>'
    generator = ScriptedGenerator(tokenizer.encode(text, add_special_tokens=False))
    with scripted_server(tokenizer, generator) as server:
        body = chat(server.url.removesuffix("/v1"), [{"role": "user", "content": "hi"}], max_tokens=100_000).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    # prompt + output <= max_model_len: the engine was asked for exactly the room that was left.
    assert generator.requests[0].sampling.max_new_tokens == MAX_MODEL_LEN - body["usage"]["prompt_tokens"]


def test_length_finish_and_logprob_floor(tokenizer: PreTrainedTokenizerBase) -> None:
    generator = ScriptedGenerator([20, 21, 22], finish_reason="length")
    generator.submit = _with_logprobs(generator, (-0.1, -1e6, float("-inf")))  # pyright: ignore[reportAttributeAccessIssue]
    with scripted_server(tokenizer, generator) as server:
        choice = chat(server.url.removesuffix("/v1"), [{"role": "user", "content": "hi"}]).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["generation_log_probs"] == [-0.1, -9999.0, -9999.0]


def _with_logprobs(generator: ScriptedGenerator, logprobs: tuple[float, ...]):
    original = generator.submit

    def submit(request: GenerationRequest) -> "Future[GenerationResult]":
        result = original(request).result()
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(result.token_ids, logprobs, result.finish_reason, 0, 0))
        return future

    return submit


def test_api_key_is_required_except_on_health(tokenizer: PreTrainedTokenizerBase) -> None:
    with scripted_server(tokenizer, ScriptedGenerator([EOS_TOKEN_ID]), api_key="secret") as server:
        root = server.url.removesuffix("/v1")
        assert httpx.get(f"{root}/v1/models").status_code == 401
        wrong = httpx.get(f"{root}/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
        assert httpx.get(f"{root}/v1/models", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert httpx.get(f"{root}/health").status_code == 200


def test_stop_shuts_down_cleanly_and_frees_the_port(tokenizer: PreTrainedTokenizerBase) -> None:
    server = scripted_server(tokenizer, ScriptedGenerator([EOS_TOKEN_ID]))
    server.start()
    assert httpx.get(f"{server.url.removesuffix('/v1')}/health").status_code == 200
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/health")
    assert not any(
        thread.name == f"policy-server-{server.port}" and thread.is_alive() for thread in threading.enumerate()
    )
    with socket.socket() as probe:  # SO_REUSEADDR tolerates TIME_WAIT leftovers but not a live listener
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", server.port))


def post_raw(root: str, path: str, body: str) -> httpx.Response:
    """POST `body` as written (lone surrogate escapes, NaN and Infinity included, which httpx's json= refuses)."""
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{root}{path}", content=body.encode(), headers=headers, timeout=60)


SAMPLING = '"model": "policy", "temperature": 1.0, "top_p": 1.0, "max_tokens": 2'


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "fragment"),
    [
        ("/tokenize", '{"messages": []}', 422, "messages", "at least 1 item"),
        (
            "/tokenize",
            '{"messages": [{"role": "user", "content": "hi \\ud800"}]}',
            400,
            "messages[0].content",
            "lone surrogate U+D800",
        ),
        ("/tokenize", '{"prompt": "hi \\ud800"}', 400, "prompt", "lone surrogate U+D800"),
        (
            "/v1/chat/completions",
            "{" + SAMPLING + ', "messages": [{"role": "user", "content": "hi \\ud800"}]}',
            400,
            "messages[0].content",
            "expected valid Unicode text",
        ),
        ("/v1/responses", "{" + SAMPLING + ', "input": "hi \\udfff"}', 400, "input", "lone surrogate U+DFFF"),
        (
            "/v1/responses",
            '{"temperature": 1.0, "top_p": 1.0, "input": "hi", "max_output_tokens": Infinity}',
            400,
            None,
            "Infinity is not a JSON number; expected a finite number",
        ),
        ("/v1/chat/completions", '{"messages": [], "temperature": NaN}', 400, None, "NaN is not a JSON number"),
        ("/v1/responses", '{"input": "hi", "top_p": 1e400}', 400, None, "expected a finite number"),
        ("/v1/chat/completions", '{"messages": [', 400, None, "not valid JSON"),
        ("/v1/chat/completions", "[" * 5000 + "]" * 5000, 400, None, "nested deeper than 64 levels"),
        (
            "/v1/chat/completions",
            "{" + SAMPLING + ', "messages": [{"role": "robot", "content": "hi"}]}',
            422,
            "messages[0].role",
            'got "robot"',
        ),
        (
            "/v1/responses",
            "{" + SAMPLING + ', "input": "hi", "max_output_tokens": "many"}',
            422,
            "max_output_tokens",
            "valid integer",
        ),
    ],
)
def test_malformed_bodies_get_4xx_naming_the_field_and_the_server_keeps_serving(
    served: tuple[str, CountingGenerator], path: str, body: str, status: int, param: str | None, fragment: str
) -> None:
    root, _ = served
    response = post_raw(root, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param and error["code"] == status
    assert chat(root, [{"role": "user", "content": "hi"}]).status_code == 200


def test_tokenize_with_required_prefix_returns_the_completion_prompt(served: tuple[str, CountingGenerator]) -> None:
    """Gym's fallback asks /tokenize for a turn's prompt ids with the chat body: they must be the spliced ones."""
    root, _ = served
    first = chat(root, [{"role": "user", "content": "Weather in Paris?"}]).json()["choices"][0]["message"]
    history = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", **first}]
    history.append({"role": "user", "content": "And in Rome?"})
    prefix = first["prompt_token_ids"] + first["generation_token_ids"]
    second = chat(root, history, required_prefix_token_ids=prefix).json()["choices"][0]["message"]
    body = {"model": "policy", "messages": history, "tools": TOOLS, "required_prefix_token_ids": prefix}
    tokens = httpx.post(f"{root}/tokenize", json=body).json()["tokens"]
    assert tokens == second["prompt_token_ids"] and tokens[: len(prefix)] == prefix


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"prompt": "hi", "required_prefix_token_ids": [1]}, "apply to the chat form"),
        ({"prompt": "hi", "chat_template_kwargs": {}}, "apply to the chat form"),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "required_prefix_token_ids": [1],
                "add_generation_prompt": False,
            },
            "needs add_generation_prompt=true",
        ),
    ],
)
def test_tokenize_options_outside_the_chat_form_are_refused(
    served: tuple[str, CountingGenerator], body: dict, fragment: str
) -> None:
    response = httpx.post(f"{served[0]}/tokenize", json=body)
    assert response.status_code == 422 and fragment in response.json()["error"]["message"]


def test_chat_template_kwargs_reach_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    greeting = copy.deepcopy(tokenizer)
    greeting.chat_template = "{{ greeting | default('plain') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    with scripted_server(greeting, ScriptedGenerator([EOS_TOKEN_ID])) as server:
        root = server.url.removesuffix("/v1")
        body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"greeting": "hello "}}
        tokens = httpx.post(f"{root}/tokenize", json=body).json()["tokens"]
        assert tokens == greeting.encode("hello hi", add_special_tokens=False)
        prompt = chat(root, body["messages"], tools=None, chat_template_kwargs={"greeting": "hello "}).json()
        assert prompt["choices"][0]["message"]["prompt_token_ids"] == tokens  # completion and tokenize agree
        reserved = httpx.post(f"{root}/tokenize", json=body | {"chat_template_kwargs": {"tokenize": True}})
        assert reserved.status_code == 400 and "['tokenize'] are arguments" in reserved.json()["error"]["message"]


def test_connections_of_the_listening_socket_get_tcp_nodelay() -> None:
    # asyncio sets TCP_NODELAY only on connections of a socket made with proto=IPPROTO_TCP (socket.create_server's
    # are proto 0); without it every answer written in two parts waited ~40 ms for the client's delayed ACK.
    async def nodelay_of_an_accepted_connection() -> int:
        accepted: asyncio.Queue[int] = asyncio.Queue()

        async def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await accepted.put(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = listening_socket("127.0.0.1", 0)
        async with await asyncio.start_server(on_connect, sock=listener):
            _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
            flag = await asyncio.wait_for(accepted.get(), 10)
            writer.close()
        return flag

    assert asyncio.run(nodelay_of_an_accepted_connection()) == 1
