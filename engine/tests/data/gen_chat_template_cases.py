"""Writes chat_template_cases.json: small templates exercising the Jinja features that
Hugging Face chat templates use, rendered the way transformers renders them (jinja2 sandbox,
trim_blocks, lstrip_blocks, loop controls, raise_exception, a json.dumps-style tojson), so that
dayone's minijinja renderer can be checked against them without Python.

Run: python3 gen_chat_template_cases.py   (needs jinja2)
"""
import json
import os

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

CONV = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
    {"role": "user", "content": "Say \"ünïcode\" & <tags>"},
]
NO_SYS = CONV[1:]

CASES = [
    # ChatML with a default system prompt.
    ("chatml", "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # Llama-3 style: bos, strip, set with a default, header tokens.
    ("llama3", "{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"),
    # Qwen style: namespace, reverse slicing, split/strip of think blocks, loop.index0.
    ("reverse_namespace", "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == \"user\" %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n    {%- endif %}\n    {%- if message.role == \"assistant\" and '</think>' in content %}\n        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n    {%- endif %}\n    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n    {%- if loop.index0 == ns.last_query_index %}{{- '[last query]' }}{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"),
    # Mistral style: alternation check with raise_exception, loop.index0 % 2, eos after assistant.
    ("alternation", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # Gemma style: role renaming, trim filter, loop.last, string methods.
    ("gemma", "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% if loop.last and message.content.endswith('>') %}{{ message.content.upper().replace('TAGS', 'T') }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"),
    # tojson of messages and nested values; dict methods.
    ("tojson", "{{ messages | tojson }}\n{{ {'a': 1, 'b': [true, none, 2.5, 'x']} | tojson }}\n{{ messages[0] | tojson(indent=2) }}\n{% for k, v in messages[1].items() %}{{ k }}={{ v }};{% endfor %}{{ messages[1].get('name', 'anon') }}"),
    # Whitespace control: lstrip_blocks / trim_blocks / explicit minus, comments.
    ("whitespace", "{# comment #}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n  U: {{ m.content }}\n    {% else %}\n  {{ m.role|title }}: {{ m.content|length }}\n    {% endif %}\n{% endfor %}\n{%- if add_generation_prompt -%}\n   GEN\n{%- endif %}\nend"),
    # continue / break, ~ concatenation, in/not in, filters.
    ("loop_controls", "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{{ loop.index ~ ':' ~ m.role[:1] ~ (m.content.split()|length|string) }} {% endfor %}{{ messages|map(attribute='role')|join(',') }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ 'yes' if 'Hi' in messages[1].content else 'no' }}|{{ (messages|last).content.rstrip('>').split(' ')|first }}"),
]


def render(src, messages, agp, bos="<s>", eos="</s>"):
    try:
        return {"output": env.from_string(src).render(messages=messages, add_generation_prompt=agp, bos_token=bos, eos_token=eos)}
    except TemplateError as e:
        return {"error": str(e)}


out = []
for name, src in CASES:
    for conv_name, conv in (("with_system", CONV), ("no_system", NO_SYS)):
        for agp in (False, True):
            r = render(src, conv, agp)
            out.append({"name": f"{name}/{conv_name}/{'gen' if agp else 'nogen'}", "template": src, "messages": conv,
                        "add_generation_prompt": agp, "bos_token": "<s>", "eos_token": "</s>", **r})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_template_cases.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write("\n")
print("wrote", path, len(out), "cases;", sum("error" in c for c in out), "expected errors")
