"""Tool calls through scripted checkpoints (see scripts.json and scripted_model() in
cli/tests/openai_server.rs): the model's greedy output after the user message `trigger` is
the script's pieces, so each parser reads real model output through the server.

For every script: the non-stream answer matches `expect`; the stream obeys the delta rules
(first delta of a call carries id + type + name, later ones only index + arguments; no empty
delta; no marker text in content or reasoning) and merges to the non-stream answer. Cases:
max_tokens cut inside the arguments gives no tool call and finish_reason length. Concurrent:
N streams at once all correct (vllm#54701).

Environment: DAYONE_GROUP (the group of scripts.json the server runs).
"""

import asyncio
import json
import os
import unittest

from common import MODEL, async_client, client, extra, main

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts.json"),
          encoding="utf-8") as f:
    GROUP = next(g for g in json.load(f)["groups"] if g["name"] == os.environ["DAYONE_GROUP"])

MARKERS = ("<|tool", "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|start|>",
           "<tool_call>", "</tool_call>", "<think>", "</think>", "\uff5c", "functions.")


def tools_for(names):
    names = sorted(set(names) | {"get_weather"})
    return [{"type": "function", "function": {
        "name": n, "description": "a tool", "parameters": {"type": "object", "properties": {}}}}
        for n in names]


ALL_TOOLS = tools_for(c["name"] for s in GROUP["scripts"] for c in s["expect"]["tool_calls"])


def request(trigger, **kw):
    kw.setdefault("max_tokens", 64)
    return dict(model=MODEL, messages=[{"role": "user", "content": trigger}], tools=ALL_TOOLS,
                temperature=0, **kw)


def no_markers(test, what, text):
    for m in MARKERS:
        test.assertNotIn(m, text or "", "%s leaks marker %r: %r" % (what, m, text))


def merge_stream(test, chunks):
    """Checks the chunk rules; returns {content, reasoning, tool_calls: [{id,name,arguments}],
    finish_reason}."""
    test.assertTrue(chunks)
    test.assertEqual(len({c.id for c in chunks}), 1, "one id")
    content, reasoning, calls, finish = "", "", {}, None
    for k, c in enumerate(chunks):
        if not c.choices:
            continue
        (ch,) = c.choices
        d = ch.delta
        if k == 0:
            test.assertEqual(d.role, "assistant")
        test.assertIsNone(finish, "a chunk after the finish")
        r = extra(d, "reasoning_content") or ""
        test.assertEqual(r, extra(d, "reasoning") or "", "reasoning spellings agree")
        has = bool(d.content) or bool(r) or bool(d.tool_calls) or ch.finish_reason is not None \
            or d.role is not None
        test.assertTrue(has, "empty delta: %r" % c)
        content += d.content or ""
        reasoning += r
        for t in d.tool_calls or []:
            if t.index not in calls:
                test.assertTrue(t.id, "first delta of call %d carries the id: %r" % (t.index, t))
                test.assertEqual(t.type, "function")
                test.assertTrue(t.function and t.function.name, "first delta carries the name")
                calls[t.index] = {"id": t.id, "name": t.function.name,
                                  "arguments": t.function.arguments or ""}
            else:
                test.assertIsNone(t.id, "later deltas carry no id: %r" % t)
                test.assertFalse(t.function.name, "later deltas carry no name: %r" % t)
                test.assertTrue(t.function.arguments, "a later delta without arguments: %r" % t)
                calls[t.index]["arguments"] += t.function.arguments
        if ch.finish_reason is not None:
            finish = ch.finish_reason
    test.assertEqual(sorted(calls), list(range(len(calls))), "call indices 0..")
    return {"content": content or None, "reasoning": reasoning or None,
            "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


def non_stream(resp):
    c = resp.choices[0]
    m = c.message
    return {"content": m.content or None,
            "reasoning": extra(m, "reasoning_content") or None,
            "tool_calls": [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                           for t in m.tool_calls or []],
            "finish_reason": c.finish_reason}


class ToolCalls(unittest.TestCase):
    def check_expect(self, what, got, expect):
        self.assertEqual(got["finish_reason"], expect["finish_reason"], "%s: %r" % (what, got))
        if "content" in expect:
            self.assertEqual(got["content"], expect["content"], "%s content: %r" % (what, got))
        if "reasoning" in expect:
            self.assertEqual(got["reasoning"], expect["reasoning"], "%s reasoning: %r" % (what, got))
        no_markers(self, what + " content", got["content"])
        no_markers(self, what + " reasoning", got["reasoning"])
        self.assertEqual(len(got["tool_calls"]), len(expect["tool_calls"]), "%s: %r" % (what, got))
        for t, e in zip(got["tool_calls"], expect["tool_calls"]):
            self.assertEqual(t["name"], e["name"], what)
            args = json.loads(t["arguments"])  # valid JSON
            self.assertIsInstance(args, dict, what)
            self.assertEqual(args, e["arguments"], "%s arguments %r" % (what, t["arguments"]))
            if "id" in e:
                self.assertEqual(t["id"], e["id"], what)
            self.assertTrue(t["id"], what)
        ids = [t["id"] for t in got["tool_calls"]]
        self.assertEqual(len(set(ids)), len(ids), "%s: call ids unique" % what)

    def run_one(self, trigger, expect, label, **kw):
        c = client()
        ns = non_stream(c.chat.completions.create(**request(trigger, **kw)))
        self.check_expect(label + " non-stream", ns, expect)
        st = merge_stream(self, list(c.chat.completions.create(**request(trigger, stream=True, **kw))))
        if expect["tool_calls"] or expect["finish_reason"] != "length":
            self.check_expect(label + " stream", st, expect)
            # Stream and non-stream agree byte for byte (ids aside: non-Kimi ids are random).
            strip = lambda x: dict(x, tool_calls=[dict(t, id=None) for t in x["tool_calls"]])
            self.assertEqual(strip(st), strip(ns), label + ": stream == non-stream")
            if trigger_has_model_ids(GROUP):
                self.assertEqual(st, ns, label + ": ids equal too")
        else:
            # A cut-off call may have streamed partially; it must not be reported as done.
            self.assertEqual(st["finish_reason"], "length", label)
            no_markers(self, label + " stream content", st["content"])
        return ns

    def test_scripts(self):
        for s in GROUP["scripts"]:
            with self.subTest(trigger=s["trigger"], note=s.get("note")):
                self.run_one(s["trigger"], s["expect"], "%s/%s" % (GROUP["name"], s["trigger"]))

    def test_reasoning_usage_and_include_reasoning(self):
        for s in GROUP["scripts"]:
            if not s["expect"]["reasoning"]:
                continue
            with self.subTest(trigger=s["trigger"]):
                c = client()
                r = c.chat.completions.create(**request(s["trigger"]))
                details = r.usage.completion_tokens_details
                self.assertTrue(details and details.reasoning_tokens > 0, r.usage)
                self.assertLess(details.reasoning_tokens, r.usage.completion_tokens)
                hidden = non_stream(c.chat.completions.create(
                    **request(s["trigger"], extra_body={"include_reasoning": False})))
                self.assertIsNone(hidden["reasoning"], "include_reasoning false hides it")
                self.check_expect("include_reasoning=false", hidden,
                                  dict(s["expect"], reasoning=None))
                st = merge_stream(self, list(c.chat.completions.create(**request(
                    s["trigger"], stream=True, extra_body={"include_reasoning": False}))))
                self.assertIsNone(st["reasoning"])

    def test_cases(self):
        for case in GROUP.get("cases", []):
            with self.subTest(case=case):
                self.run_one(case["trigger"], case["expect"],
                             "%s/%s max_tokens=%s" % (GROUP["name"], case["trigger"],
                                                      case.get("max_tokens")),
                             max_tokens=case["max_tokens"])

    def test_tool_choice_none_is_plain_content(self):
        s = next(s for s in GROUP["scripts"] if s["expect"]["tool_calls"])
        r = client().chat.completions.create(**request(s["trigger"], tool_choice="none"))
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_concurrent_streams(self):
        conc = GROUP.get("concurrent")
        if not conc:
            self.skipTest("no concurrent case in this group")
        s = next(s for s in GROUP["scripts"] if s["trigger"] == conc["trigger"])

        async def one(c):
            chunks = [k async for k in await c.chat.completions.create(
                **request(s["trigger"], stream=True))]
            return chunks

        async def run():
            c = async_client()
            got = await asyncio.gather(*[one(c) for _ in range(conc["streams"])])
            await c.close()
            return got

        for k, chunks in enumerate(asyncio.run(run())):
            merged = merge_stream(self, chunks)
            self.check_expect("concurrent stream %d" % k, merged, s["expect"])


def trigger_has_model_ids(group):
    # Kimi ids come from the model (`functions.NAME:IDX`), so they are deterministic.
    return group["name"].startswith("kimi")


if __name__ == "__main__":
    main()
