#!/usr/bin/env python3
"""The chat-template reference: Python Jinja2 configured as transformers' apply_chat_template
configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the
{% generation %} tag, and its tojson / raise_exception / strftime_now helpers).

Renders every case of the @huggingface/jinja reference file (gen_reference.mjs) plus Python-only
feature cases, and writes the expected outputs: Python's output is the reference; each case also
records whether @huggingface/jinja agrees. Error cases keep the message/line checks of the JS
reference only where both engines fail.
usage: gen_python.py <hf_refs.json> <out.json>   (exit 77 when jinja2 is not installed)"""
import json, sys
from datetime import datetime
try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python jinja2 not installed: skipping")
    sys.exit(77)


class Generation(Extension):  # transformers' AssistantTracker, without the index tracking
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

users = [{"name": "carol", "n": 3}, {"name": "alice", "n": 4}]
PY_CASES = [
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
    # issue 23: Python str() / repr() / json.dumps where @huggingface/jinja prints JavaScript values
    ("undefined_string", "document_id: \"{{ doc.id | string }}\" [{{ missing | string }}] [{{ missing }}]", {"doc": {}}),
    ("string_of_containers", "{{ {'a': 1} | string }} {{ ['x'] | string }} {{ false | string }} {{ true }} {{ none }} {{ args }} {{ [1.5, none, true, 'it\\'s', \"q\\\"\"] }}", {"args": {"path": "/tmp", "n": 2, "flags": [True, None]}}),
    ("tojson_floats", "{{ 1e-07 | tojson }} {{ x | tojson }} {{ [0.1, 1.0, 2.5e20, 1e16, 123456789.0] | tojson }} {{ 1e-07 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}", {"x": {"lr": 1e-07, "big": 1.5e300}}),
    ("concat_str", "{{ 'a' ~ none ~ true ~ 1.0 ~ [1] ~ {'k': 'v'} }} {{ [none, true, 2.0] | join(',') }}", {}),
    ("python_equality", "{{ 1 == '1' }} {{ '1' == 1 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 0 == false }} {{ none == false }}", {}),
    ("repr_unicode", "{{ ['é', '\\u00a0', '\\t', '\\x7f', '日本'] }}", {}),
    ("namespace_repr", "{% set ns = namespace(a=1, b='x') %}{{ ns }}", {}),
    ("tuple_repr", "{{ (1,) }} {{ (1, 'a') }} {{ () }}", {}),
]


def render(tpl, ctx):
    try:
        return {"expected": env.from_string(tpl).render(**ctx)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        hf = json.load(f)
    out, disagree = [], 0
    for c in hf["cases"]:
        tpl = c.get("template") if c["kind"] == "tpl" else c.get("py_template")
        case = {k: v for k, v in c.items() if k not in ("expected", "error", "error_contains", "error_line", "py_template")}
        if tpl is None:
            case["error"] = "no chat template"
            out.append(case)
            continue
        r = render(tpl, c.get("context") or {})
        case.update(r)
        if "error" in r and "error" in c:
            for k in ("error_contains", "error_line"):
                if k in c:
                    case[k] = c[k]
        agrees = ("error" in r and "error" in c) or ("expected" in r and r["expected"] == c.get("expected"))
        case["hf_agrees"] = agrees
        disagree += not agrees
        out.append(case)
    for name, tpl, ctx in PY_CASES:
        out.append({"kind": "tpl", "name": "python/" + name, "template": tpl, "context": ctx, **render(tpl, ctx)})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"have_models": hf.get("have_models", 0), "cases": out}, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(out)} python-jinja2 cases to {sys.argv[2]} (jinja2 {jinja2.__version__}); "
          f"@huggingface/jinja differs on {disagree} of {len(hf['cases'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
