"""The `demo` command's parts: reset, traffic, drain, verify.

Run it with ``python example_project/manage.py demo``; see example_project/README.md.
"""
