# SPDX-License-Identifier: MIT
"""The man pages as man-db and groff read them, and in step with the programs
and the configuration reference they describe."""

import os
import re
import subprocess

import pytest

from conftest import BUILD, MAN_PAGES, SRC, man_dir, need, run

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "MANWIDTH": "80"}


def rendered(page):
    return run(["man", "-l", BUILD / "docs" / "man" / page], env=ENV).stdout


@pytest.fixture(autouse=True)
def built(tmp_path):
    man_dir(tmp_path)  # skips when the pages were not built


@pytest.mark.parametrize("page", MAN_PAGES)
def test_renders_without_warnings(page):
    need("groff", "man")
    path = BUILD / "docs" / "man" / page
    p = run(["groff", "-man", "-ww", "-z", "-Tutf8", path], env=ENV)
    assert p.stderr == "", p.stderr
    p = run(["man", "--warnings", "-l", path], env=ENV)
    assert p.stderr == "", p.stderr
    name = page.rsplit(".", 1)[0]
    for heading in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"):
        assert re.search(rf"^{heading}$", p.stdout, re.M), f"{page}: no {heading} section"
    assert p.stdout.startswith(f"{name}({page.rsplit('.', 1)[1]})")


@pytest.mark.parametrize("page", MAN_PAGES)
def test_name_line_indexes(page):
    """mandb/apropos read the NAME line: it must parse as 'name - summary'."""
    need("lexgrog")
    p = run(["lexgrog", BUILD / "docs" / "man" / page], env=ENV)
    name = page.rsplit(".", 1)[0]
    assert re.search(rf'"{re.escape(name)} - \S', p.stdout), p.stdout


def long_options(help_text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", help_text))


def test_feedd_page_documents_every_option():
    help_text = run([BUILD / "daemon" / "feedd", "--help"]).stdout
    page = rendered("feedd.8")
    missing = sorted(o for o in long_options(help_text) if o not in page)
    assert not missing, f"feedd --help lists options feedd(8) does not: {missing}"


def test_feedctl_page_documents_every_command_and_option():
    help_text = run([BUILD / "client" / "feedctl" / "feedctl", "--help"]).stdout
    page = rendered("feedctl.1")
    commands = re.findall(r"^  ([a-z]+)\b", help_text.split("Commands:", 1)[1].split("Options:", 1)[0], re.M)
    assert commands, help_text
    missing = sorted(c for c in commands if not re.search(rf"^       {c}\b", page, re.M))
    missing += sorted(o for o in long_options(help_text) if o not in page)
    assert not missing, f"feedctl --help lists what feedctl(1) does not: {missing}"


def test_conf_page_documents_every_key():
    """Every key in the tables of docs/configuration.md is in feedd.conf(5)."""
    keys = set(re.findall(r"^\| `([a-z][a-z0-9_]*)` \|", (SRC / "docs" / "configuration.md").read_text(), re.M))
    assert len(keys) >= 10, keys
    page = rendered("feedd.conf.5")
    missing = sorted(k for k in keys if not re.search(rf"(?<![\w]){k}(?![\w])", page))
    assert not missing, f"docs/configuration.md has keys feedd.conf(5) does not: {missing}"


def test_libfeed_page_documents_every_exported_function():
    syms = re.findall(r"^\s+(feed_\w+);", (SRC / "client" / "libfeed.sym").read_text(), re.M)
    assert syms
    page = rendered("libfeed.3")
    missing = sorted(s for s in syms if s not in page)
    assert not missing, f"client/libfeed.sym exports functions libfeed(3) does not describe: {missing}"


def test_installed_in_their_sections(tmp_path):
    """meson install puts each page in man<section> under mandir."""
    dest = tmp_path / "dest"
    env = dict(os.environ, DESTDIR=str(dest))
    p = subprocess.run(["meson", "install", "-C", str(BUILD), "--no-rebuild", "--tags", "man"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    found = {f.name: f.parent.name for f in dest.rglob("*") if f.is_file()}
    for page in MAN_PAGES:
        assert found.get(page) == "man" + page.rsplit(".", 1)[1], found
