"""Per-QP counters, like rxe's ``rxe_counters`` but per queue pair."""

from collections import Counter
from dataclasses import dataclass, field

from rdmakit.wire import NakCode


@dataclass(slots=True)
class QpStats:
    """Counters for one QP (plain integers and ``Counter``s; read them freely)."""

    packets_in: int = 0
    packets_out: int = 0
    #: Request packets sent again (go-back-N).
    retransmits: int = 0
    #: Go-back-N sequences started (timeouts, NAK-sequence errors, implied NAKs).
    retries: int = 0
    #: NAK-sequence errors judged random losses (no queue, no CNP: ``congestion.random_loss``).
    random_losses: int = 0
    timeouts: int = 0
    #: Request packets sent again as tail-loss probes (``engine.probe``; not go-back-N, not retries).
    probes: int = 0
    implied_naks: int = 0
    #: Duplicate requests received.
    duplicates: int = 0
    #: Packets the transport saw marked CE, CNPs sent for them and CNPs received (Annex A17.9).
    ce_received: int = 0
    cnps_sent: int = 0
    cnps_received: int = 0
    rnr_naks_sent: int = 0
    rnr_naks_received: int = 0
    #: NAKs by ``NakCode`` name.
    naks_sent: Counter[str] = field(default_factory=Counter)
    naks_received: Counter[str] = field(default_factory=Counter)
    #: Packets dropped, by reason.
    dropped: Counter[str] = field(default_factory=Counter)

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def count_nak_sent(self, code: int) -> None:
        self.naks_sent[_nak_name(code)] += 1

    def count_nak_received(self, code: int) -> None:
        self.naks_received[_nak_name(code)] += 1


def _nak_name(code: int) -> str:
    try:
        return NakCode(code).name
    except ValueError:
        return f"RESERVED_{code:#x}"
