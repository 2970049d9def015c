"""Pictures and reports from the JSON the CLI prints: plans, searches, scaling studies and runs.

One module per picture (memory, steptime, timeline, search, scaling, runs); each function takes the
parsed objects, writes one PNG and returns a ``style.Figure`` holding the numbers it drew, so tests
can hold every picture to its JSON. ``build.write_report`` assembles them with an index.html.

matplotlib is imported only when a picture is drawn; nothing here imports torch.
"""
