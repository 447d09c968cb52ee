"""The reports, each rendered from the results view: HTML, Markdown, JUnit, Stryker's
schema, and the releases page.
"""
