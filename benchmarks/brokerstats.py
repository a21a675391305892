"""The local broker's own view of a workload: its request metrics and its GC pauses.

With ``--broker-metrics`` the harness starts the broker with JMX on a loopback port and a
GC log, and after each workload records, per request type, what the broker measured
(``kafka.network:type=RequestMetrics,name=<part>,request=<type>``): how many, their
mean over the workload (from the counts and means before and after it), and p50/p99 of
the broker's histogram (Yammer's reservoir, biased to the last five minutes, so the
workload's own traffic dominates it). The parts say where a request's time went: queued
for an I/O thread, handled there (local), waiting for something else (remote: a
replica, a purgatory, the transaction verification round trip), queued for and sent on
the network thread. Read with the JDK's own JMX client (a single-file Java program), so
nothing is added to the broker's classpath.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

REQUESTS = (
    "Produce",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "TxnOffsetCommit",
    "EndTxn",
    "WriteTxnMarkers",
    "FetchConsumer",
    "OffsetCommit",
)
PARTS = (
    "TotalTimeMs",
    "RequestQueueTimeMs",
    "LocalTimeMs",
    "RemoteTimeMs",
    "ResponseQueueTimeMs",
    "ResponseSendTimeMs",
)

_READER = """\
import javax.management.*;
import javax.management.remote.*;

public class JmxRequests {
    public static void main(String[] args) throws Exception {
        String url = "service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi";
        try (JMXConnector c = JMXConnectorFactory.connect(new JMXServiceURL(url))) {
            MBeanServerConnection m = c.getMBeanServerConnection();
            String[] attrs = {"Count", "Mean", "50thPercentile", "99thPercentile", "Max"};
            StringBuilder out = new StringBuilder("{");
            for (int i = 1; i < args.length; i++) {
                String[] rp = args[i].split(":");
                ObjectName n = new ObjectName("kafka.network:type=RequestMetrics,name="
                    + rp[1] + ",request=" + rp[0]);
                out.append(i > 1 ? "," : "").append('"').append(args[i]).append("\\":[");
                try {
                    AttributeList got = m.getAttributes(n, attrs);
                    for (int j = 0; j < got.size(); j++) {
                        Object v = ((Attribute) got.get(j)).getValue();
                        out.append(j > 0 ? "," : "").append(((Number) v).doubleValue());
                    }
                } catch (InstanceNotFoundException e) { /* no such request yet */ }
                out.append("]");
            }
            System.out.println(out.append("}"));
        }
    }
}
"""


def jvm_options(jmx_port: int, gc_log: Path) -> list[str]:
    """The broker JVM's options for `read`: JMX on loopback without auth, and a GC log."""
    return [
        f"-Dcom.sun.management.jmxremote.port={jmx_port}",
        f"-Dcom.sun.management.jmxremote.rmi.port={jmx_port}",
        "-Dcom.sun.management.jmxremote.host=127.0.0.1",
        "-Djava.rmi.server.hostname=127.0.0.1",
        "-Dcom.sun.management.jmxremote.authenticate=false",
        "-Dcom.sun.management.jmxremote.ssl=false",
        f"-Xlog:gc,gc+phases:file={gc_log}:uptime",  # gc+phases: ZGC logs its pauses there
    ]


class BrokerStats:
    """Reads the broker's request metrics and GC log; `since_last` gives one workload's."""

    def __init__(self, work: Path, jmx_port: int, gc_log: Path) -> None:
        self.port, self.gc_log = jmx_port, gc_log
        self.source = work / "JmxRequests.java"
        self.source.write_text(_READER)
        self._last: dict[str, list[float]] = {}
        self._gc_seen = 0

    def read(self) -> dict[str, list[float]]:
        """``"<request>:<part>"`` -> [count, mean, p50, p99, max] as the broker has them now."""
        names = [f"{r}:{p}" for r in REQUESTS for p in PARTS]
        java = shutil.which("java") or "java"
        done = subprocess.run(
            [java, str(self.source), str(self.port), *names],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"reading the broker's JMX: {done.stderr.strip()[-500:]}")
        out: dict[str, list[float]] = json.loads(done.stdout)
        return out

    def since_last(self) -> dict[str, Any]:
        """Per request type and part: count and mean since the last call, and the broker's
        p50/p99 now; and the GC pauses logged since the last call."""
        now = self.read()
        requests: dict[str, Any] = {}
        for name, values in now.items():
            if not values:
                continue
            count, mean, p50, p99, top = values
            n0, m0 = (self._last.get(name) or [0.0, 0.0])[:2]
            n = count - n0
            request, part = name.split(":")
            requests.setdefault(request, {})[part] = {
                "n": int(n),
                "mean": round((count * mean - n0 * m0) / n, 3) if n > 0 else None,
                "p50": round(p50, 3),
                "p99": round(p99, 3),
                "max_ever": round(top, 3),
            }
        self._last = now
        return {"requests": requests, "gc": self._gc_pauses()}

    def _gc_pauses(self) -> dict[str, Any]:
        """The GC pauses logged since the last call: how many, their sum and the longest."""
        lines = self.gc_log.read_text(errors="replace").splitlines() if self.gc_log.exists() else []
        fresh, self._gc_seen = lines[self._gc_seen :], len(lines)
        pauses = [float(m.group(1)) for ln in fresh if (m := _PAUSE.search(ln)) and "Pause" in ln]
        return {
            "pauses": len(pauses),
            "total_ms": round(sum(pauses), 1),
            "max_ms": round(max(pauses), 1) if pauses else 0.0,
        }


_PAUSE = re.compile(r"(\d+\.\d+)ms\s*$")


def summary(stats: dict[str, Any]) -> str:
    """One line: each request type's mean (p99) total time and its largest part."""
    parts = []
    for request in REQUESTS:
        got = stats["requests"].get(request, {})
        total = got.get("TotalTimeMs")
        if not total or not total["n"]:
            continue
        split = {p: got[p]["mean"] or 0.0 for p in PARTS[1:] if p in got}
        top = max(split, key=lambda p: split[p]) if split else "?"
        parts.append(
            f"{request} n {total['n']} mean {total['mean']} ms (p99 {total['p99']}; "
            f"most in {top.removesuffix('TimeMs')} {split.get(top, 0):.2f})"
        )
    gc = stats["gc"]
    parts.append(f"GC {gc['pauses']} pauses, {gc['total_ms']} ms, max {gc['max_ms']} ms")
    return "broker: " + "; ".join(parts)
