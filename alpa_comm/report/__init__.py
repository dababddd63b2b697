"""The presentation shell: tables, charts, Chrome traces, schedule pictures, suite
result files and progress output. The only code that writes files or draws; the
core hands it data (plans, ``SimResult``, ``PipelineResult``, measured steps)."""
