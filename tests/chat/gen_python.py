#!/usr/bin/env python3
"""Reference outputs from Python Jinja2, configured like transformers' apply_chat_template
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson filter).
Covers features @huggingface/jinja lacks (there smelt follows Python Jinja).
usage: gen_python.py <out.json>   (exit 77 when jinja2 is not installed)"""
import json, sys
try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.ext import loopcontrols
except ImportError:
    print("python jinja2 not installed: skipping")
    sys.exit(77)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(msg):
    raise Exception(msg)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

users = [{"name": "carol", "n": 3}, {"name": "alice", "n": 4}]
CASES = [
    ("select_reject", "{{ nums | select('odd') | join(',') }} {{ nums | reject('even') | join(',') }} {{ nums | select('divisibleby', 3) | join(',') }} {{ nums | select | join(',') }} {{ nums | select('gt', 2) | join(',') }} {{ nums | reject('lt', 3) | join(',') }}", {"nums": [0, 1, 2, 3, 4, 6]}),
    ("round", "{{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(1, 'floor') }} {{ 3.01 | round(1, 'ceil') }} {{ 7 | round }} {{ -1.25 | round(1) }}", {}),
    ("batch", "{% for row in items | batch(2, 'x') %}{{ row | join('') }};{% endfor %}|{% for row in items | batch(3) %}{{ row | join('') }};{% endfor %}", {"items": ["a", "b", "c", "d", "e"]}),
    ("escape", "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }}", {}),
    ("strip_chars", "[{{ '\\n\\n  x  \\n'.strip('\\n') }}][{{ 'xxhixx'.lstrip('x') }}][{{ 'xxhixx'.rstrip('x') }}][{{ '  y '.strip() }}][{{ 'ab\\n \\n'.rstrip('\\n') }}]", {}),
    ("default_noparen", "[{{ missing | default }}][{{ missing | d('z') }}][{{ '' | d('e', true) }}]", {}),
    ("count_min_max_sum", "{{ l | count }} {{ l | min }} {{ l | max }} {{ l | sum }} {{ users | sum(attribute='n') }} {{ 'abc' | count }}", {"l": [4, 2, 9], "users": users}),
    ("str_repeat_compare", "{{ 'ab' * 3 }}[{{ '-' * 0 }}]{{ 'yes' if 'a' < 'b' else 'no' }} {{ 'yes' if 'b' >= 'c' else 'no' }}", {}),
    ("test_args", "{{ 'y' if 6 is divisibleby 3 else 'n' }} {{ 'y' if 2 is in [1,2] else 'n' }} {{ 'y' if 'a' is in 'cat' else 'n' }} {{ 'y' if 5 is gt 3 else 'n' }} {{ 'y' if x is sameas none else 'n' }} {{ 'y' if 3 is eq(3) else 'n' }} {{ 'y' if 1.5 is float else 'n' }}", {"x": None}),
    ("string_for", "{% for ch in 'héllo' %}{{ ch }}.{% endfor %}", {}),
    ("str_methods_extra", "{{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ '-'.join(['a','b']) }} {{ 'y' if '123'.isdigit() else 'n' }} {{ 'y' if 'ab1'.isalpha() else 'n' }}", {}),
    ("map_filter", "{{ ['a','B'] | map('upper') | join(',') }} {{ ['1','2'] | map('int') | sum }}", {}),
    ("string_as_list", "{{ 'abc' | list | join('-') }} {{ 'abc' | first }} {{ 'abc' | last }} {{ 'abc' | reverse }}", {}),
    ("join_attribute", "{{ users | join(', ', attribute='name') }}", {"users": users}),
    ("string_of_none", "{{ none | string }} {{ 'x' ~ (1 | string) }}", {}),
    ("continue_else", "{% for x in [1,2] %}{% continue %}{% else %}E{% endfor %}|{% for x in [1,2,3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}|{% for x in [1,2,3] %}{{ x }}{% continue %}X{% endfor %}", {}),
    ("indent_string_width", "{{ 'a\\nb' | indent('> ', first=true) }}", {}),
    ("trim_chars", "{{ '--x--' | trim('-') }}", {}),
    ("round_int_precision", "{{ 1234 | round(-2) }} {{ 0.5 | round }} {{ 1.5 | round }}", {}),
    ("undefined_in_loop_filter", "{% for m in msgs if m.content is defined %}{{ m.content }}{% endfor %}", {"msgs": [{"content": "a"}, {}, {"content": "b"}]}),
]

out = []
for name, tpl, ctx in CASES:
    case = {"kind": "tpl", "name": "python/" + name, "template": tpl, "context": ctx}
    try:
        case["expected"] = env.from_string(tpl).render(**ctx)
    except Exception as e:  # noqa: BLE001
        case["error"] = str(e)
    out.append(case)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump({"cases": out}, f, ensure_ascii=False, indent=1)
print(f"wrote {len(out)} python-jinja2 cases to {sys.argv[1]}")
