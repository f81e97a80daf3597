"""The tasks maskserve runs with a masked LM: one module each, all of one shape (:mod:`.task`).

A task says how its request becomes queued rows (``plan``) and how the rows' answers fold back
into its answer (``fold``). The service runs any task the same way (``FillMaskService.plan`` and
``.fold``: long work off the event loop), and every surface (the API's bodies, the Open Inference
Protocol's tensors, the demo page's forms) reaches the model through one function,
``request/run_task.py``'s ``run_task``. No HTTP here.

    task.py        the Task protocol, the Plan it makes, and Ran: what running one gives back
    fill_mask.py   fill-mask: each text's query, whole-word targets' copies folded back in
    score.py       /score: each scored token's masked copy, the copies' answers summed per text
"""
