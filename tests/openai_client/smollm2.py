"""The `openai` client against SmolLM2-135M-Instruct (the default model): its chat template
gives a non-empty short answer; /tokenize with messages counts usage.prompt_tokens; the
streamed answer equals the non-stream one. Kept to a few short requests (the CPU runs it
slowly)."""

import unittest

from common import MODEL, client, extra, main, post

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


class SmolLM2(unittest.TestCase):
    def test_chat_template_answer(self):
        c = client()
        r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                      temperature=0)
        text = r.choices[0].message.content
        self.assertTrue(text and text.strip(), repr(text))
        self.assertEqual(r.usage.completion_tokens, 4 if r.choices[0].finish_reason == "length"
                         else r.usage.completion_tokens)
        s, tok = post("/tokenize", {"messages": MESSAGES})
        self.assertEqual(s, 200, tok)
        self.assertEqual(tok["count"], r.usage.prompt_tokens)
        # The same prompt again: streamed, served from the prefix cache.
        stream = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
        streamed = "".join(ch.delta.content or "" for k in chunks for ch in k.choices)
        self.assertEqual(streamed, text)
        usage = chunks[-1].usage
        self.assertGreater(usage.prompt_tokens_details.cached_tokens, 0, usage)

    def test_json_object_is_valid_json(self):
        """response_format json_object: the answer parses as one JSON object (constrained
        decoding), whatever the model would have said; json_schema is refused, not ignored."""
        import json

        import openai

        c = client()
        r = c.chat.completions.create(
            model=MODEL, max_tokens=48, temperature=0,
            messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
            response_format={"type": "json_object"})
        choice = r.choices[0]
        if choice.finish_reason == "stop":
            value = json.loads(choice.message.content)
            self.assertIsInstance(value, dict, choice.message.content)
        else:
            # Cut by max_tokens: still a valid prefix of an object.
            self.assertTrue(choice.message.content.lstrip().startswith("{"), choice.message.content)
        with self.assertRaises(openai.BadRequestError):
            c.chat.completions.create(
                model=MODEL, max_tokens=4, messages=MESSAGES,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": {"type": "object"}}})


if __name__ == "__main__":
    main()
