"""Sphinx configuration of episode's documentation site.

    pip install ".[docs]" && sphinx-build -W docs docs/_build/html

The pages are Markdown (MyST); the API reference is read from the docstrings
of the installed package (run from the repository root, the source tree's
episode/ has no compiled modules and is not on sys.path).
"""
import episode

project = "episode"
author = "the episode developers"
copyright = "the episode developers"
release = version = episode.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
# Links to a page's sections (#differences-from-rllib and the like).
myst_heading_anchors = 3

# Members in the order the source defines them; types in the descriptions,
# where they are read more easily than in long signatures.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"episode {release}"
