"""GBNF grammars through llama.cpp's /completion at temperature 1: every sampled output
ends because the grammar did (stop_type "eos") and parses with an independent checker
(Python's own parser, regular expressions)."""
import ast
import concurrent.futures as cf
import re

import pytest
import requests

ARITH = r'''root ::= term (ws op ws term){0,5}
term ::= num | "(" num (ws op ws num){0,3} ")"
op ::= [-+*/]
num ::= [1-9] [0-9]{0,3}
ws ::= " "?
'''
LIST = r'''root ::= item{1,5}
item ::= "- " [a-zA-Z] [a-zA-Z ]{0,29} "\n"
'''
CHESS = r'''root ::= "1. " move " " move ("\n" [2-9] ". " move " " move){0,3}
move ::= (pawn | piece | castle) [+#]?
pawn ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
piece ::= [NBKQR] "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
'''
MOVE = r"(([a-h]x)?[a-h][1-8](=[NBRQ])?|[NBKQR]x?[a-h][1-8]|O-O(-O)?)[+#]?"


def check_arith(text):
    ast.parse(text, mode="eval")
    assert re.fullmatch(r"[0-9+\-*/() ]+", text)


def check_list(text):
    assert re.fullmatch(r"(- [a-zA-Z][a-zA-Z ]{0,29}\n){1,5}", text)


def check_chess(text):
    assert re.fullmatch(rf"1\. {MOVE} {MOVE}(\n[2-9]\. {MOVE} {MOVE}){{0,3}}", text)


@pytest.mark.parametrize("grammar,prompt,check", [
    (ARITH, "Compute:", check_arith),
    (LIST, "Shopping list:\n", check_list),
    (CHESS, "A chess game:\n", check_chess),
], ids=["arithmetic", "list", "chess"])
def test_sampled_outputs_parse(server, grammar, prompt, check):
    def one(seed):
        r = requests.post(server.url + "/completion", timeout=300, json={
            "prompt": prompt, "grammar": grammar, "n_predict": 200, "temperature": 1.0, "seed": seed})
        assert r.status_code == 200, r.text
        return r.json()
    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    for o in outs:
        assert o["stop_type"] == "eos", o
        check(o["content"])
