"""Why is my job stuck? The analyzer as a library (it needs no torch).

python examples/quickstart_analyze.py commscope_traces
"""

import sys

from commscope.analyze import analyze, format_report, write_html, write_perfetto

analysis = analyze(sys.argv[1] if len(sys.argv) > 1 else "commscope_traces")
root = analysis.findings[0]  # root cause first
print(analysis.verdict, root.kind, root.culprit_ranks, root.collective_seq_id)
print(format_report(analysis))
write_perfetto(analysis, "timeline.json")  # open in https://ui.perfetto.dev
write_html(analysis, "report.html")  # one offline page
