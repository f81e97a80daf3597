"""Batch jobs (``maskserve batch INPUT OUTPUT``): a file of rows answered by the server's own tasks
and engine, without HTTP, resumable, on this machine or a Ray cluster.

    cli.py         the command: its own options, and the server's model and limit flags
    formats.py     rows in and out of JSON Lines, CSV and Parquet, streamed
    job_tasks.py   a row through the server's parser and task, out as the API's answer
    slices.py      a slice of rows planned (tokenized, deduplicated, packed) and folded back
    job.py         the three overlapping stages: plan, infer, write
    parts.py       the output as atomic parts while it runs, joined at the end
    manifest.py    what the output was made with: input, model revision, task, settings
    model.py       the job's model, loaded once, and its revision
    progress.py    a bar on a terminal, lines elsewhere
    ray_job.py     the same job through Ray Data, and its public callable class
"""
