"""The `openai` client against tiny llama (random weights, word-level tokenizer whose pieces
fuse, chat template): the wire format of chat and completions, streamed and not.

Run by cli/tests/openai_server.rs (`openai_client_basic`); extra environment: DAYONE_BIN (the
dayone binary) and DAYONE_MODEL_DIR (the checkpoint) for the `dayone generate` comparison.
"""

import json
import os
import subprocess
import unittest

import openai

from common import MODEL, URL, async_client, client, extra, main, post, raw_sse

USER = [{"role": "user", "content": "hello world a b"}]
GREEDY = {"temperature": 0}
NO_EOS = {"ignore_eos": True}


def chat(**kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", USER)
    return client().chat.completions.create(**kw)


def completion(**kw):
    kw.setdefault("model", MODEL)
    return client().completions.create(**kw)


def collect_chat_stream(stream):
    """Checks the chunk rules of serving.md A3 on a chat stream; returns (chunks, text per
    choice, finish per choice, usage chunk or None)."""
    chunks = list(stream)
    assert chunks, "no chunks"
    ids = {c.id for c in chunks}
    assert len(ids) == 1, "one id on every chunk, got %s" % ids
    assert chunks[0].id.startswith("chatcmpl-"), chunks[0].id
    texts, finish, first_seen = {}, {}, set()
    usage = None
    for i, c in enumerate(chunks):
        assert c.object == "chat.completion.chunk", c.object
        if not c.choices:
            assert c.usage is not None, "a chunk with no choices must carry usage"
            assert i == len(chunks) - 1, "the usage chunk comes last"
            usage = c
            continue
        for ch in c.choices:
            d = ch.delta
            if ch.index not in first_seen:
                assert d.role == "assistant", "first chunk of choice %d: role, got %r" % (ch.index, d)
                first_seen.add(ch.index)
            else:
                assert d.role is None, "role only in the first chunk"
            assert ch.index not in finish, "choice %d got a chunk after its finish" % ch.index
            has = bool(d.content) or bool(d.tool_calls) or bool(extra(d, "reasoning_content")) \
                or ch.finish_reason is not None or ch.logprobs is not None or d.role is not None
            assert has, "empty delta: %r" % c
            texts[ch.index] = texts.get(ch.index, "") + (d.content or "")
            if ch.finish_reason is not None:
                finish[ch.index] = ch.finish_reason
    assert set(finish) == first_seen, "every choice finishes once: %s vs %s" % (finish, first_seen)
    return chunks, texts, finish, usage


class Chat(unittest.TestCase):
    def test_non_stream(self):
        r = chat(max_tokens=8, **GREEDY, extra_body=NO_EOS)
        self.assertTrue(r.id.startswith("chatcmpl-"), r.id)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.index, 0)
        self.assertEqual(c.message.role, "assistant")
        self.assertTrue(c.message.content, "non-empty content")
        self.assertEqual(c.finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 8)

    def test_stream_shape_and_usage(self):
        stream = chat(max_tokens=8, stream=True, stream_options={"include_usage": True},
                      **GREEDY, extra_body=NO_EOS)
        chunks, texts, finish, usage = collect_chat_stream(stream)
        self.assertEqual(finish, {0: "length"})
        self.assertIsNotNone(usage, "usage chunk with include_usage")
        self.assertEqual(usage.choices, [])
        self.assertEqual(usage.usage.completion_tokens, 8)
        # The first chunk is the role with empty content (vLLM).
        self.assertEqual(chunks[0].choices[0].delta.content, "")
        # Without include_usage: no usage chunk.
        _, _, _, usage = collect_chat_stream(chat(max_tokens=4, stream=True, **GREEDY))
        self.assertIsNone(usage)

    def test_continuous_usage_and_n2_usage(self):
        chunks = list(chat(max_tokens=5, n=2, stream=True, **GREEDY, extra_body=NO_EOS,
                           stream_options={"include_usage": True,
                                           "continuous_usage_stats": True}))
        for c in chunks:
            self.assertIsNotNone(c.usage, "continuous_usage_stats: usage on every chunk")
        counts = [c.usage.completion_tokens for c in chunks]
        self.assertEqual(counts, sorted(counts), "usage grows")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10, "two choices of 5")

    def test_stream_equals_non_stream(self):
        for n_tokens in (1, 5, 17):
            r = chat(max_tokens=n_tokens, **GREEDY, extra_body=NO_EOS)
            _, texts, finish, _ = collect_chat_stream(
                chat(max_tokens=n_tokens, stream=True, **GREEDY, extra_body=NO_EOS))
            self.assertEqual(texts[0], r.choices[0].message.content, "tokens %d" % n_tokens)
            self.assertEqual(finish[0], r.choices[0].finish_reason)

    def test_raw_sse_done(self):
        body = {"model": MODEL, "messages": USER, "max_tokens": 3, "stream": True,
                "temperature": 0, "stream_options": {"include_usage": True}}
        ctype, events, text = raw_sse("/v1/chat/completions", body)
        self.assertTrue(ctype.startswith("text/event-stream"), ctype)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events.count("[DONE]"), 1)
        self.assertTrue(text.endswith("data: [DONE]\n\n"), repr(text[-40:]))
        parsed = [json.loads(e) for e in events[:-1]]
        self.assertEqual(parsed[-1]["choices"], [])
        self.assertIn("usage", parsed[-1])
        for p in parsed[:-1]:
            self.assertNotIn("error", p)
            self.assertEqual(p["object"], "chat.completion.chunk")
        # with_raw_response also sees the stream end.
        raw = client().chat.completions.with_raw_response.create(
            model=MODEL, messages=USER, max_tokens=2, stream=True, temperature=0)
        self.assertEqual(raw.http_response.status_code, 200)
        body_text = raw.http_response.read().decode()
        self.assertTrue(body_text.rstrip().endswith("data: [DONE]"), body_text[-80:])

    def test_n2(self):
        r = chat(max_tokens=6, n=2, temperature=0.8, seed=7, extra_body=NO_EOS)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.completion_tokens, 12)
        _, texts, finish, _ = collect_chat_stream(
            chat(max_tokens=6, n=2, temperature=0.8, seed=7, stream=True, extra_body=NO_EOS))
        self.assertEqual(sorted(finish), [0, 1])
        self.assertEqual(sorted(texts), [0, 1])
        # Greedy: both choices are the one greedy answer.
        r = chat(max_tokens=6, n=2, **GREEDY, extra_body=NO_EOS)
        self.assertEqual(r.choices[0].message.content, r.choices[1].message.content)

    def test_logprobs(self):
        r = chat(max_tokens=8, logprobs=True, top_logprobs=3, **GREEDY, extra_body=NO_EOS)
        c = r.choices[0]
        lp = c.logprobs.content
        self.assertEqual(len(lp), r.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in lp), c.message.content)
        for t in lp:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertEqual(bytes(t.bytes), t.token.encode())
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
        # Streamed logprobs match.
        stream = chat(max_tokens=8, logprobs=True, top_logprobs=3, stream=True, **GREEDY,
                      extra_body=NO_EOS)
        toks = [t.token for ch in stream for c2 in ch.choices if c2.logprobs
                for t in c2.logprobs.content]
        self.assertEqual(toks, [t.token for t in lp])
        # Without logprobs: none.
        self.assertIsNone(chat(max_tokens=2, **GREEDY).choices[0].logprobs)

    def test_stop_string(self):
        full = chat(max_tokens=16, **GREEDY, extra_body=NO_EOS).choices[0].message.content
        stop = full[5:8]
        at = full.find(stop)
        self.assertGreater(at, 0, full)
        r = chat(max_tokens=16, stop=[stop, "never-there"], **GREEDY, extra_body=NO_EOS)
        c = r.choices[0]
        self.assertEqual(c.message.content, full[:at])
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(extra(c, "stop_reason"), stop)
        _, texts, finish, _ = collect_chat_stream(
            chat(max_tokens=16, stop=stop, stream=True, **GREEDY, extra_body=NO_EOS))
        self.assertEqual(texts[0], full[:at])
        self.assertEqual(finish[0], "stop")
        # include_stop_str_in_output keeps it.
        r = chat(max_tokens=16, stop=stop, **GREEDY,
                 extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
        self.assertEqual(r.choices[0].message.content, full[:at] + stop)

    def test_max_completion_tokens_beats_max_tokens(self):
        r = chat(max_completion_tokens=3, max_tokens=10, **GREEDY, extra_body=NO_EOS)
        self.assertEqual(r.usage.completion_tokens, 3)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_tokenize_messages_equals_prompt_tokens(self):
        r = chat(max_tokens=2, **GREEDY, extra_body={"return_token_ids": True})
        s, tok = post("/tokenize", {"messages": USER})
        self.assertEqual(s, 200, tok)
        self.assertEqual(tok["count"], r.usage.prompt_tokens)
        self.assertEqual(tok["tokens"], extra(r, "prompt_token_ids"))
        ids = extra(r.choices[0], "token_ids")
        self.assertEqual(len(ids), r.usage.completion_tokens)
        s, de = post("/detokenize", {"tokens": ids})
        self.assertEqual(s, 200, de)
        if r.choices[0].finish_reason == "length":
            self.assertEqual(de["prompt"], r.choices[0].message.content)


KNOWN_BUGS = os.environ.get("DAYONE_RUN_KNOWN_BUGS") == "1"


@unittest.skipUnless(KNOWN_BUGS, "server bug: a seed does not reproduce across requests "
                     "(the engine seeds each sequence with seed + its request id); "
                     "run by the ignored Rust test openai_client_seed")
class Seeds(unittest.TestCase):
    def test_same_seed_same_text(self):
        kw = dict(max_tokens=16, temperature=0.8, extra_body=NO_EOS)
        a = chat(seed=42, **kw).choices[0].message.content
        b = chat(seed=42, **kw).choices[0].message.content
        self.assertEqual(a, b, "same seed, same text")
        others = {chat(seed=s, **kw).choices[0].message.content for s in (1, 2, 3, 4)}
        self.assertGreater(len(others | {a}), 1, "different seeds give different texts")

    def test_n2_stream_equals_non_stream(self):
        r = chat(max_tokens=6, n=2, temperature=0.8, seed=7, extra_body=NO_EOS)
        _, texts, _, _ = collect_chat_stream(
            chat(max_tokens=6, n=2, temperature=0.8, seed=7, stream=True, extra_body=NO_EOS))
        self.assertEqual(texts, {c.index: c.message.content for c in r.choices})

    def test_completions_seed(self):
        kw = dict(prompt="hello world", max_tokens=12, temperature=1.0, seed=3,
                  extra_body=NO_EOS)
        self.assertEqual(completion(**kw).choices[0].text, completion(**kw).choices[0].text)


class Completions(unittest.TestCase):
    def test_non_stream(self):
        r = completion(prompt="hello world", max_tokens=8, **GREEDY, extra_body=NO_EOS)
        self.assertTrue(r.id.startswith("cmpl-"), r.id)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(len(r.choices), 1)
        self.assertTrue(r.choices[0].text)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 8)

    def test_prompt_shapes(self):
        r = completion(prompt=["hello world", "a b"], max_tokens=4, **GREEDY, extra_body=NO_EOS)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        single = completion(prompt="a b", max_tokens=4, **GREEDY, extra_body=NO_EOS)
        self.assertEqual(r.choices[1].text, single.choices[0].text)
        r = completion(prompt=[[1, 5, 6], [1, 7, 8]], max_tokens=4, **GREEDY, extra_body=NO_EOS)
        self.assertEqual(len(r.choices), 2)
        self.assertEqual(r.usage.prompt_tokens, 6)
        r = completion(prompt=[1, 5, 6], max_tokens=4, **GREEDY, extra_body=NO_EOS)
        self.assertEqual(r.usage.prompt_tokens, 3)

    def test_stream_equals_non_stream(self):
        r = completion(prompt="hello world", max_tokens=12, **GREEDY, extra_body=NO_EOS)
        chunks = list(completion(prompt="hello world", max_tokens=12, stream=True,
                                 stream_options={"include_usage": True}, **GREEDY,
                                 extra_body=NO_EOS))
        self.assertEqual(len({c.id for c in chunks}), 1)
        text = "".join(ch.text for c in chunks for ch in c.choices)
        self.assertEqual(text, r.choices[0].text)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual([ch.finish_reason for c in chunks for ch in c.choices
                          if ch.finish_reason], ["length"])
        ctype, events, _ = raw_sse("/v1/completions", {"model": MODEL, "prompt": "hello",
                                                       "max_tokens": 2, "stream": True})
        self.assertEqual(events[-1], "[DONE]")

    def test_logprobs(self):
        r = completion(prompt="hello world", max_tokens=8, logprobs=2, **GREEDY, extra_body=NO_EOS)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 8)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 8)
        self.assertTrue(all(len(t) <= 2 for t in lp.top_logprobs))
        self.assertEqual(lp.text_offset[0], 0)

    def test_return_token_ids_match_generate(self):
        prompt = [1, 5, 6, 7, 9]
        r = completion(prompt=prompt, max_tokens=10, **GREEDY,
                       extra_body={"ignore_eos": True, "return_token_ids": True})
        self.assertEqual(extra(r, "prompt_token_ids"), prompt)
        got = extra(r.choices[0], "token_ids")
        out = subprocess.run(
            [os.environ["DAYONE_BIN"], "generate", "--backend", "cpu", "--model",
             os.environ["DAYONE_MODEL_DIR"], "--prompt-ids", ",".join(map(str, prompt)),
             "-n", "10", "--ignore-eos", "--output", "json"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        want = json.loads(out.stdout)["generated_ids"]
        self.assertEqual(got, want, "serve == dayone generate")
        # Streamed token ids too.
        chunks = completion(prompt=prompt, max_tokens=10, stream=True, **GREEDY,
                            extra_body={"ignore_eos": True, "return_token_ids": True})
        ids = [t for c in chunks for ch in c.choices for t in (extra(ch, "token_ids") or [])]
        self.assertEqual(ids, want)

    def test_prefix_cache_cached_tokens(self):
        words = " ".join("w%d" % (10 + (i * 37) % 240) for i in range(300))
        first = completion(prompt=words, max_tokens=2, **GREEDY)
        second = completion(prompt=words, max_tokens=2, **GREEDY)
        self.assertEqual(first.choices[0].text, second.choices[0].text)
        details = second.usage.prompt_tokens_details
        self.assertIsNotNone(details)
        self.assertGreater(details.cached_tokens, 0, second.usage)
        self.assertLess(details.cached_tokens, second.usage.prompt_tokens + 1)


class Misc(unittest.TestCase):
    def test_models(self):
        ids = [m.id for m in client().models.list().data]
        self.assertEqual(ids, [MODEL])

    def test_errors(self):
        with self.assertRaises(openai.BadRequestError) as e:
            chat(max_tokens=2, temperature=-1)
        self.assertIn("temperature", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            chat(max_tokens=2, model="not-" + MODEL)
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=URL + "/v1", api_key="wrong", max_retries=0).models.list()
        with self.assertRaises(openai.BadRequestError):
            chat(max_tokens=2, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object"}}})
        with self.assertRaises(openai.BadRequestError):
            chat(messages=[])

    def test_async_concurrent(self):
        import asyncio

        async def run():
            c = async_client()
            rs = await asyncio.gather(*[
                c.chat.completions.create(model=MODEL, messages=USER, max_tokens=6,
                                          temperature=0, extra_body=NO_EOS)
                for _ in range(6)])
            await c.close()
            return [r.choices[0].message.content for r in rs]

        texts = asyncio.run(run())
        self.assertEqual(len(set(texts)), 1, texts)


if __name__ == "__main__":
    main()
