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
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


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
    # Jinja2 scoping, lazy loops, generators, undefined values, Python str and number semantics
    ("loop_filter_lazy", "{% set ns = namespace(s=0) %}{% for x in [1,2,3,4] if ns.s < 3 %}{% set ns.s = ns.s + x %}{{ x }}{% endfor %}|{% set ns.s = 0 %}{% for x in [1,2,3,4] if ns.s < 3 %}{% set ns.s = ns.s + x %}{{ x }}{{ loop.last }}{% endfor %}", {}),
    ("generator_one_pass", "{% set g = [1,2,3]|select %}{% for x in g %}{{ x }}{% break %}{% endfor %}|{{ g|list }}|{% set g = [1,2,3]|select %}{% for x in g %}{{ x }}{{ loop.last }}{% break %}{% endfor %}|{{ g|list }}|{% set m = [1,2]|map('string') %}{{ m|join }}{{ m|join }}|{{ 2 in [1,2,3]|select }}", {}),
    ("macro_closure", "{% macro f() %}[{{ i }}]{% endmacro %}{% for i in [1,2] %}{{ f() }}{% endfor %}{% set i = 5 %}{% macro g() %}{{ i }}{% endmacro %}{% set i = 6 %}{{ g() }}", {}),
    ("loop_object", "{% for x in [1,2,3] %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.cycle('a','b') }}/{{ loop.changed(x) }}/{{ loop.previtem }}/{{ loop.nextitem }}/{{ loop.depth }};{% endfor %}{% for x in [1,1,2] %}{{ loop.changed(x) }}{% endfor %}{% for x in [1] %}{% set y = 1 %}{% endfor %}[{{ y }}]", {}),
    ("test_semantics", "{{ true is number }} {{ x is sequence }} {{ x is iterable }} {{ x is callable }} {{ none is iterable }} {{ {} is sequence }} {{ 'abc1' is lower }} {{ '123' is lower }} {{ 'Ab' is upper }} {{ 3.0 is odd }} {{ 1 is eq true }} {{ 1 in [1.0] }} {{ 2 is in [1, 2] }}", {}),
    ("filters_on_non_strings", "{{ 5|upper }} {{ none|lower }} {{ [1]|title }} {{ 12|replace(1, 'x') }} {{ 3|trim }} {{ 'a b  c'|wordcount }} {{ [1,2]|join(0) }}", {}),
    ("python_arithmetic", "{{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ -7 // 2 }} {{ true + 1 }} {{ [1,2] * 2 }} {{ (1,) + (2,) }} {{ 2 ** 10 }} {{ 10 / 4 }}", {}),
    ("int_float_parsing", "{{ ' 42 '|int }} {{ '1_000'|int }} {{ '0x1A'|int }} {{ '0x1A'|int(0, 16) }} {{ '1e3'|int }} {{ '-3.9'|int }} {{ -3.9|int }} {{ 'nan'|int }} {{ none|int }} {{ 'inf'|float }} {{ ' 1_0.5 '|float }} {{ '.5'|float }} {{ '5.'|float }} {{ 'x'|float(1) }} {{ 0x1F }} {{ 1_000 }} {{ 2.5E+3 }}", {}),
    ("case_mapping", "{{ 'ǆemal ßtraße'|title }} {{ 'ǆemal ßtraße'.title() }} {{ 'ßa'|capitalize }} {{ 'ΑΣ ΑΣΑ Σ'|lower }} {{ 'İx'|lower }} {{ 'straße'|upper }} {{ \"they're bill's 1st\"|title }} {{ \"they're bill's 1st\".title() }} {{ 'a-b(c[d<e f\tg'|title }}", {}),
    ("iterators_and_views", "{{ [1,2]|reverse|list }}|{{ 'abc'|reverse }}|{{ {'a':1}|items|list }}|{{ {'a':1}.items() }}|{{ {'a':1}.keys() }}|{{ {'a':1}.values()|list }}|{{ d|dictsort }}|{{ range(3) }} {{ range(1, 9, 3)|list }} {{ range(3)|length }}", {"d": {"b": 1, "a": 2}}),
    ("aggregates", "{{ [3,1,2]|sort }} {{ ['b','A','a']|unique|list }} {{ ['b','A','a']|unique(true)|list }} {{ [1, 1.0, true]|unique|list }} {{ ['B','a']|min }} {{ ['B','a']|max }} [{{ []|min }}] {{ [1,2,3]|select('odd')|first }} {{ {'b':1,'a':2}|join(',') }} {{ 'abc'|first }} {{ {'x':1,'y':2}|last }} {{ [1,2]|batch(1)|list }}", {}),
    ("attribute_paths", "{{ users|map(attribute='n', default=0)|list }} {{ pairs|sum(attribute='1') }} {{ users|selectattr('n')|list }} {{ users|selectattr('n', 'gt', 0)|list }} {{ pairs|map(attribute='0')|list }}", {"users": [{"n": 1}, {}], "pairs": [[1, 2], [3, 4]]}),
    ("tojson_args", "{{ x|tojson(indent=0) }}|{{ x|tojson(indent='--') }}|{{ x|tojson(true) }}|{{ (1,'a')|tojson }}|{{ x|tojson(sort_keys=1) }}", {"x": {"b": [1, "é"], "a": 2}}),
    ("indent_lines", "{{ 'a\\r\\nb\\nc\\n'|indent(2) }}|{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('>>', true) }}", {}),
    ("getattr_getitem", "{{ l[10] }}|{{ 'ab'[5] }}|{{ d.nope }}|{{ none.x }}|{{ d['items'] }}|{{ d.get('z', 3) }}|{{ d.get(1) }}|{{ [1,2,3][1:] }} {{ (1,2,3)[1:] }} {{ 'abcdef'[::2] }}|{% for a, b in {'x': 1}.items() %}{{ a }}={{ b }}{% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}", {"l": [1], "d": {"items": 7}}),
    ("undefined_lenient_ops", "{{ 'x' ~ missing ~ 'y' }} {{ missing is defined }} {{ missing|length }} {{ missing|list }} [{{ missing|string }}] [{{ missing|upper }}] {{ missing == missing }} {{ 'a' in missing }} {{ missing in [1] }} {% for x in missing %}{% else %}empty{% endfor %}[{{ missing|join(',') }}{{ missing|first }}{{ missing|last }}] {{ missing|items|list }} {{ missing|sort }}", {}),
    ("string_formatting", "{{ '%s-%d' % ('a', 3) }} {{ '%5.2f|%-4s|%03d|%x|%r' % (3.14159, 'ab', 7, 255, 'q') }} {{ '%(a)s' % {'a': 1} }} {{ '%s' % [1] }} {{ '%d%%' % 5 }} {{ 'x{}y{}'.format(1, 'a') }} {{ '{0}{0}{name}'.format(1, name='n') }} {{ '{:>5}|{:<4}|{:^6}|{:05d}|{:.2f}|{:+d}|{:x}|{:,}'.format('a', 'b', 'c', 42, 3.14159, 3, 255, 1234567) }} {{ '{!r}'.format('a') }} {{ ' a b c '.split(none, 1) }} {{ '-'.join(['a', 'b']) }}", {}),
    ("with_block", "{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}{{ a }}[{{ c }}]{% for m in ms %}{% with role = m.role %}{{ role }};{% endwith %}{% endfor %}", {"ms": [{"role": "u"}, {"role": "a"}]}),
    ("generation_scope", "{% for m in ms %}{% generation %}{% set x = 1 %}{{ m }}{{ loop.index }}{% endgeneration %}[{{ x }}]\n  {% generation %}\n  y\n  {% endgeneration %}\n{% endfor %}", {"ms": ["a", "b"]}),
    # errors where Python raises (each must fail in smelt too)
    ("err_undefined_attr", "{{ missing.x }}", {}),
    ("err_undefined_arith", "{{ missing < 1 }}", {}),
    ("err_undefined_tojson", "{{ missing|tojson }}", {}),
    ("err_undefined_int", "{{ missing|int }}", {}),
    ("err_undefined_call", "{{ missing() }}", {}),
    ("err_generator_len", "{{ [1,2]|select|length }}", {}),
    ("err_generator_last", "{{ [1,2]|select|last }}", {}),
    ("err_generator_add", "{{ ([1]|select) + [1] }}", {}),
    ("err_generator_json", "{{ [1]|map('string')|tojson }}", {}),
    ("err_str_odd", "{{ 'abc' is odd }}", {}),
    ("err_format_args", "{{ '%s and %s' % ('a',) }}", {}),
    ("err_join_non_str", "{{ '-'.join([1, 2]) }}", {}),
    ("err_undefined_sum", "{{ users|sum(attribute='n') }}", {"users": [{"n": 1}, {}]}),
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
