"""`runstream ui`: a web dashboard over the runs read model and the journal.

Needs the ``ui`` extra (``pip install 'runstream[ui]'``: Starlette, uvicorn, Jinja2);
`command` is importable without it, `server` is not.
"""
