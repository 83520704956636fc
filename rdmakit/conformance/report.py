"""The suite's output: a readable table, JSON, and JUnit XML.

Each row is named by the DUT's role (what is being tested: ``responder``,
``requester`` or ``cm``). In JUnit a case is a ``testcase`` whose
``conformance.result`` property holds its outcome; a FAIL is a ``failure``;
SKIPPED and KNOWN-DEVIATION are ``skipped``, and a KNOWN-DEVIATION also
carries a ``conformance.deviation`` property and a ``KNOWN-DEVIATION:`` line in
its ``system-out``, so a CI report that folds skips away still shows it.
"""

import json
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

from .harness import Case
from .runner import DEVIATION, FAIL, SKIPPED, Result


def case_json(c: Case) -> dict[str, str]:
    return {"id": c.id, "role": c.role, "purpose": c.purpose, "follows": c.follows, "expect": c.expect}


def table(results: list[Result]) -> str:
    width = max((len(r.case.id) for r in results), default=10)
    lines = [f"{'CASE':<{width}}  {'ROLE':<9}  {'RESULT':<15}  DETAIL"]
    for r in results:
        detail = r.detail.splitlines()[0] if r.detail else r.case.purpose
        lines.append(f"{r.case.id:<{width}}  {r.case.role:<9}  {r.status:<15}  {detail[:140]}")
    counts = Counter(r.status for r in results)
    lines.append(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f" ({len(results)} cases)")
    return "\n".join(lines)


def to_json(results: list[Result], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "summary": dict(Counter(r.status for r in results)),
        "results": [
            {
                **case_json(r.case),
                "result": r.status,
                "detail": r.detail,
                "seconds": round(r.seconds, 3),
                "icrc_check": r.icrc,
                "log": r.log if r.status == FAIL else [],
            }
            for r in results
        ],
    }


def to_junit(results: list[Result], name: str = "rdmakit-conformance") -> bytes:
    counts = Counter(r.status for r in results)
    suite = ET.Element(
        "testsuite", name=name, tests=str(len(results)), failures=str(counts[FAIL]),
        skipped=str(counts[SKIPPED] + counts[DEVIATION]), errors="0",
        time=f"{sum(r.seconds for r in results):.3f}",
    )  # fmt: skip
    for r in results:
        tc = ET.SubElement(suite, "testcase", classname=f"conformance.{r.case.role}", name=r.case.id,
                           time=f"{r.seconds:.3f}")  # fmt: skip
        props = ET.SubElement(tc, "properties")
        ET.SubElement(props, "property", name="conformance.result", value=r.status)
        ET.SubElement(props, "property", name="conformance.dut_role", value=r.case.role)
        out = [f"follows: {r.case.follows}", f"expect: {r.case.expect}"]
        if r.status == FAIL:
            f = ET.SubElement(tc, "failure", message=r.detail.splitlines()[0][:500] if r.detail else "")
            f.text = "\n".join([r.detail, *r.log])
        elif r.status in (SKIPPED, DEVIATION):
            ET.SubElement(tc, "skipped", message=f"{r.status}: {r.detail}"[:500])
        if r.status == DEVIATION:
            ET.SubElement(props, "property", name="conformance.deviation", value=r.detail[:1000])
            out.append(f"KNOWN-DEVIATION: {r.detail}")
        ET.SubElement(tc, "system-out").text = "\n".join(out)
    xml: bytes = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    return xml + b"\n"


def dumps(doc: object) -> str:
    return json.dumps(doc, indent=2) + "\n"
