"""The presentation shell: tables, charts, Chrome traces, schedule pictures and progress
output. The only code of the library that writes files or draws; the core hands it data
(plans, ``SimResult``, ``PipelineResult``, measured steps). The benchmarks' result files
are the benchmark package's (``alpa_comm_bench.report``, ``alpa_comm_bench.suite_report``),
drawn with these charts and tables."""
