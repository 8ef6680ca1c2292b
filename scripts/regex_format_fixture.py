#!/usr/bin/env python3
"""Writes grammar/tests/fixtures/regex_format.jsonl: candidate strings for the `regex`
format (random sequences of regex tokens, mutations of real-world patterns, and known edge
cases), each labelled valid when Python's `re.compile` and Node's `new RegExp(s)` and
`new RegExp(s, "u")` all accept it. `grammar/tests/json_keywords.rs` checks that the
grammar admits none of the invalid ones.

Usage: python3 scripts/regex_format_fixture.py grammar/tests/fixtures/regex_format.jsonl
(needs `node` on PATH; the seed is fixed, so the output is reproducible for a given Python
and Node).
"""
import random, json, re, warnings, subprocess, sys
warnings.simplefilter('ignore')
random.seed(7)
toks = ['a','b','c','0','9','5','z','Z','A','-','^','$','.','|','?','*','+','(',')','[',']','{','}',
        '\\','\\d','\\w','\\s','\\b','\\B','\\S','\\.','\\/','\\-','\\\\','\\x4','\\x41','\\u004','\\u0041',
        '/',',','1','2','3','?:','?=','?!','?<','?<=','?P<n>','{2}','{2,}','{1,3}','{3,1}','{,2}','{99,100}',
        'a-z','z-a','0-9','A-Z','A-z','\\d-x',' ','_','"',"'",'\\n','\\t','\\0','\\1','\\k','\\p','\\c','\\v','\\f','é','\\]','\\[','\\^','\\{','\\}']
real = [r'^[a-zA-Z0-9_]{3,16}$', r'^[a-zA-Z0-9]+$', r'^\d+(\.\d+)?$', r'^https?://[^\s/$.?#].[^\s]*$',
        r'^(\d+)%$', r'\s*(\d+\.?\d*)%', r'^v?(\d+)\.(\d+)\.(\d+)$', r'.*\.ts$', r'^(?:[a-z0-9-]+\.)+[a-z]{2,}$',
        r'^[A-Z]{2}-\d{4}$', r'(foo|bar)+', r'^(?!test).*$', r'^[\w.+-]+@[\w-]+\.[\w.-]+$', r'[^abc]', r'a{2}?b+?c*?',
        r'^$', r'', r'\bword\b', r'(a(b(c)))', r'(a(b(c(d))))', r'[a-z-]', r'[-a-z]', r'[\d-]', r'[\w.-]+', r'[^^]', r'[^]', r'[]',
        r'*', '\\', r'a**', r'(?<name>a)', r'(?P<name>a)', r'\1', r'(a)\1', r'x{3,2}', r'[z-a]', r'a{,3}', r'a{', r'a}', r']', r'^*', r'\b+',
        r'(?=a)*', r'(?<=a)b', r'\p{L}', r'\u{41}', r'[\b]', r'\cA', r'\0', r'(?i)abc', r'[[]', r'[a-\d]', r'a{70000}', r'a{65535}', r'a{100,200}']
cands = set(real)
for _ in range(2500):
    n = random.randint(1, 10)
    cands.add(''.join(random.choice(toks) for _ in range(n)))
for r in real:
    for _ in range(20):
        l = list(r)
        if not l: continue
        i = random.randrange(len(l))
        op = random.random()
        if op < 0.4: del l[i]
        elif op < 0.8: l.insert(i, random.choice(toks))
        else: l[i] = random.choice(toks)
        cands.add(''.join(l))
cands = sorted(cands)
def py_ok(s):
    try: re.compile(s); return True
    except Exception: return False
node = subprocess.run(['node','-e','''
const lines=require("fs").readFileSync(0,"utf8").split("\\n").filter(x=>x.length);
for (const l of lines){const s=JSON.parse(l);let a=1,b=1;try{new RegExp(s)}catch(e){a=0};try{new RegExp(s,"u")}catch(e){b=0};console.log(a+""+b)}
'''], input='\n'.join(json.dumps(c) for c in cands)+'\n', capture_output=True, text=True, check=True).stdout.split()
assert len(node)==len(cands)
out=[]
for c,nv in zip(cands,node):
    ok = py_ok(c) and nv=='11'
    out.append((ok,c))
print(sum(o for o,_ in out), len(out), file=sys.stderr)
with open(sys.argv[1] if len(sys.argv) > 1 else 'regex_format.jsonl','w') as f:
    for ok,c in out:
        f.write(json.dumps({"regex": c, "valid": ok}, ensure_ascii=False)+'\n')
