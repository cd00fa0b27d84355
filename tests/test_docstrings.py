"""Tests for agentloop._docstrings: tool docstring -> description, params, returns."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import _docstrings
from agentloop._docstrings import ParsedDocstring, parse_docstring

EMPTY = ParsedDocstring("", {}, None)


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(None, id="none"),
        pytest.param("", id="empty"),
        pytest.param("   \n\t\n  ", id="whitespace-only"),
    ],
)
def test_empty_docstring(doc: str | None) -> None:
    """Missing or blank docstrings give an empty result."""
    assert parse_docstring(doc) == EMPTY


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param("Add two numbers.", "Add two numbers.", id="one-line"),
        pytest.param("   Add two numbers.   ", "Add two numbers.", id="one-line-padded"),
        pytest.param(
            """
            Add two numbers.
            """,
            "Add two numbers.",
            id="summary-on-second-line",
        ),
        pytest.param(
            """Add two numbers.

            The numbers may be ints or floats.
            Overflow is not checked.

            A second paragraph.
            """,
            "Add two numbers.\n\nThe numbers may be ints or floats.\n"
            "Overflow is not checked.\n\nA second paragraph.",
            id="extended-paragraphs",
        ),
        pytest.param(
            """Summary.

            Example usage::

                add(1, 2)
            """,
            "Summary.\n\nExample usage::\n\n    add(1, 2)",
            id="literal-block-kept-dedented",
        ),
        pytest.param(
            "Returns: the current time.",
            "Returns: the current time.",
            id="first-line-returns-prose-is-summary",
        ),
        pytest.param(
            "Summary.\n\nNote: this is prose, not a section.",
            "Summary.\n\nNote: this is prose, not a section.",
            id="inline-note-is-prose",
        ),
        pytest.param(
            "See :class:`Foo` for details.\n:func:`bar` is related.",
            "See :class:`Foo` for details.\n:func:`bar` is related.",
            id="rest-roles-are-not-fields",
        ),
        pytest.param(
            "Summary.\n\nDetails\n-------\nSome details.",
            "Summary.\n\nDetails\n-------\nSome details.",
            id="unknown-underlined-heading-kept",
        ),
    ],
)
def test_description_only(doc: str, expected: str) -> None:
    """Docstrings without sections are returned as the (cleaned) description."""
    assert parse_docstring(doc) == ParsedDocstring(expected, {}, None)


def test_uses_cleandoc_on_function_docstring() -> None:
    """A real function's indented docstring is dedented like inspect.cleandoc."""

    def tool(city: str, days: int = 1) -> str:
        """Get the weather forecast.

        Looks the city up in the forecast service.

        Args:
            city: Name of the city.
            days: How many days
                to forecast.

        Returns:
            A short forecast.
        """
        return city * days

    parsed = parse_docstring(tool.__doc__)
    assert parsed == ParsedDocstring(
        "Get the weather forecast.\n\nLooks the city up in the forecast service.",
        {"city": "Name of the city.", "days": "How many days to forecast."},
        "A short forecast.",
    )
    assert inspect.cleandoc(tool.__doc__ or "").startswith(parsed.description)


def test_result_is_frozen() -> None:
    """ParsedDocstring is an immutable dataclass."""
    parsed = parse_docstring("Summary.")
    with pytest.raises(AttributeError):
        parsed.description = "other"  # type: ignore[misc]


# --------------------------------------------------------------------------- Google


GOOGLE_CASES = [
    pytest.param(
        """Add numbers.

        Args:
            a: The first number.
            b: The second number.
        """,
        ParsedDocstring(
            "Add numbers.", {"a": "The first number.", "b": "The second number."}, None
        ),
        id="args-simple",
    ),
    pytest.param(
        """Add numbers.

        Args:
            a (int): The first number.
            b (dict[str, list[int]], optional): Mapping (nested) of things.
            c (Callable[[int], str]): A callback: called once.
        """,
        ParsedDocstring(
            "Add numbers.",
            {
                "a": "The first number.",
                "b": "Mapping (nested) of things.",
                "c": "A callback: called once.",
            },
            None,
        ),
        id="args-types-in-parentheses",
    ),
    pytest.param(
        """Search.

        Arguments:
            query: The text to search
                for, across several
                lines.
            limit: Max results.

                A second paragraph of the limit description.
        """,
        ParsedDocstring(
            "Search.",
            {
                "query": "The text to search for, across several lines.",
                "limit": "Max results. A second paragraph of the limit description.",
            },
            None,
        ),
        id="arguments-multiline",
    ),
    pytest.param(
        """Search.

        Parameters:
            query:
                Description only on the next line.
        """,
        ParsedDocstring("Search.", {"query": "Description only on the next line."}, None),
        id="parameters-description-on-next-line",
    ),
    pytest.param(
        """Call something.

        Params:
            *args: Positional arguments.
            **kwargs: Keyword arguments.
            \\*escaped: Escaped star.
        """,
        ParsedDocstring(
            "Call something.",
            {
                "args": "Positional arguments.",
                "kwargs": "Keyword arguments.",
                "escaped": "Escaped star.",
            },
            None,
        ),
        id="params-star-args",
    ),
    pytest.param(
        """Compute.

        Args:
            x: The input.

        Returns:
            The result, which spans
            two lines.
        """,
        ParsedDocstring("Compute.", {"x": "The input."}, "The result, which spans two lines."),
        id="returns-multiline",
    ),
    pytest.param(
        """Compute.

        Return:
            int: The result.
        """,
        ParsedDocstring("Compute.", {}, "int: The result."),
        id="return-singular",
    ),
    pytest.param(
        """Generate.

        Yields:
            Successive values.
        """,
        ParsedDocstring("Generate.", {}, "Successive values."),
        id="yields",
    ),
    pytest.param(
        """Compute.

        Returns: The result inline.
        """,
        ParsedDocstring("Compute.", {}, "The result inline."),
        id="returns-inline",
    ),
    pytest.param(
        """Fetch a URL.

        Details about fetching.

        Args:
            url: Where to go.

        Raises:
            ValueError: If the URL is bad.

        Example:
            >>> fetch("https://example.com")

        Examples:
            More examples.

        Note:
            A note.

        Notes:
            Notes.

        Attributes:
            attr: An attribute.

        See Also:
            other_function

        Warning:
            Careful.

        Todo:
            * Finish it.

        Returns:
            The body.
        """,
        ParsedDocstring(
            "Fetch a URL.\n\nDetails about fetching.", {"url": "Where to go."}, "The body."
        ),
        id="other-sections-removed",
    ),
    pytest.param(
        """Summary.

        Args:
            x: An x.

        Text after a section is still description.
        """,
        ParsedDocstring(
            "Summary.\n\nText after a section is still description.", {"x": "An x."}, None
        ),
        id="description-after-section",
    ),
    pytest.param(
        """Summary.

        Args:
            x, y: Both coordinates.
        """,
        ParsedDocstring("Summary.", {"x": "Both coordinates.", "y": "Both coordinates."}, None),
        id="comma-separated-names",
    ),
    pytest.param(
        """Summary.

        Keyword Args:
            timeout (float): Seconds to wait.
        """,
        ParsedDocstring("Summary.", {"timeout": "Seconds to wait."}, None),
        id="keyword-args",
    ),
    pytest.param(
        """Summary.

        Args:
            x: Has a url
                http://example.com in it.
        """,
        ParsedDocstring("Summary.", {"x": "Has a url http://example.com in it."}, None),
        id="url-in-continuation",
    ),
    pytest.param(
        """Summary.

        ARGS:
            x: Upper-case header.
        """,
        ParsedDocstring("Summary.", {"x": "Upper-case header."}, None),
        id="case-insensitive-header",
    ),
    pytest.param(
        """Summary.

        Args:
            x: Documented.
            y:
        """,
        ParsedDocstring("Summary.", {"x": "Documented."}, None),
        id="empty-description-omitted",
    ),
    pytest.param(
        """Summary.

        Args:
            x (int: Unbalanced parenthesis.
            y: Fine.
        """,
        ParsedDocstring("Summary.", {"y": "Fine."}, None),
        id="unbalanced-parenthesis-skipped",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), GOOGLE_CASES)
def test_google_style(doc: str, expected: ParsedDocstring) -> None:
    """Google-style sections are parsed and removed from the description."""
    assert parse_docstring(doc) == expected


# --------------------------------------------------------------------------- NumPy


NUMPY_CASES = [
    pytest.param(
        """Add numbers.

        Parameters
        ----------
        a : int
            The first number.
        b : float, optional
            The second number,
            over two lines.

        Returns
        -------
        float
            The sum.
        """,
        ParsedDocstring(
            "Add numbers.",
            {"a": "The first number.", "b": "The second number, over two lines."},
            "The sum.",
        ),
        id="parameters-and-returns",
    ),
    pytest.param(
        """Move.

        Parameters
        ----------
        x, y : int
            Coordinates.
        *args
            Extra positional.
        \\*\\*kwargs : dict
            Extra keywords.
        """,
        ParsedDocstring(
            "Move.",
            {
                "x": "Coordinates.",
                "y": "Coordinates.",
                "args": "Extra positional.",
                "kwargs": "Extra keywords.",
            },
            None,
        ),
        id="multiple-names-and-stars",
    ),
    pytest.param(
        """Compute.

        An extended description.

        Parameters
        ----------
        x : int
            Input.

            Second paragraph.

        Other Parameters
        ----------------
        verbose : bool
            Talk more.

        Returns
        -------
        result : int
            The output.

        Yields
        ------
        int
            Values.

        Raises
        ------
        ValueError
            When bad.

        See Also
        --------
        other : Another function.

        Notes
        -----
        Some notes.

        Examples
        --------
        >>> compute(1)
        1

        Attributes
        ----------
        attr : int
            An attribute.
        """,
        ParsedDocstring(
            "Compute.\n\nAn extended description.",
            {"x": "Input. Second paragraph.", "verbose": "Talk more."},
            "The output.",
        ),
        id="all-sections",
    ),
    pytest.param(
        """Compute.

        Returns
        -------
        int
        """,
        ParsedDocstring("Compute.", {}, "int"),
        id="returns-type-only",
    ),
    pytest.param(
        """Compute.

        Parameters
        ----------
        x : int
        y : int
            Only y documented.
        """,
        ParsedDocstring("Compute.", {"y": "Only y documented."}, None),
        id="param-without-description-omitted",
    ),
    pytest.param(
        """Compute.

        Parameters
        ----------
        kwargs :
            Not a Google header.
        """,
        ParsedDocstring("Compute.", {"kwargs": "Not a Google header."}, None),
        id="entry-that-looks-like-google-header",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), NUMPY_CASES)
def test_numpy_style(doc: str, expected: ParsedDocstring) -> None:
    """NumPy-style underlined sections are parsed and removed from the description."""
    assert parse_docstring(doc) == expected


# --------------------------------------------------------------------------- Sphinx


SPHINX_CASES = [
    pytest.param(
        """Add numbers.

        :param a: The first number.
        :param b: The second number.
        :returns: The sum.
        """,
        ParsedDocstring(
            "Add numbers.", {"a": "The first number.", "b": "The second number."}, "The sum."
        ),
        id="param-returns",
    ),
    pytest.param(
        """Add numbers.

        :param int a: The first number.
        :param dict[str, int] b: A mapping.
        :type a: int
        :rtype: int
        :return: The sum.
        """,
        ParsedDocstring("Add numbers.", {"a": "The first number.", "b": "A mapping."}, "The sum."),
        id="inline-types-and-type-fields",
    ),
    pytest.param(
        """Do things.

        :parameter a: Via parameter.
        :arg b: Via arg.
        :argument c: Via argument.
        :key d: Via key.
        :keyword e: Via keyword.
        :param *args: Star args.
        :param **kwargs: Star kwargs.
        """,
        ParsedDocstring(
            "Do things.",
            {
                "a": "Via parameter.",
                "b": "Via arg.",
                "c": "Via argument.",
                "d": "Via key.",
                "e": "Via keyword.",
                "args": "Star args.",
                "kwargs": "Star kwargs.",
            },
            None,
        ),
        id="field-aliases",
    ),
    pytest.param(
        """Search.

        More detail here.

        :param query: The text to
            search for, over
            several lines.
        :raises ValueError: If the query is empty.
        :raises: Something else.
        :returns:
            The hits.
        """,
        ParsedDocstring(
            "Search.\n\nMore detail here.",
            {"query": "The text to search for, over several lines."},
            "The hits.",
        ),
        id="continuations-and-raises",
    ),
    pytest.param(
        """Search.

        :param query: The query.

        Trailing prose after the field list.
        """,
        ParsedDocstring(
            "Search.\n\nTrailing prose after the field list.", {"query": "The query."}, None
        ),
        id="prose-after-fields",
    ),
    pytest.param(
        """Search.

        :param: Missing name.
        :unknown thing: Not a known field, kept.
        """,
        ParsedDocstring("Search.\n\n:unknown thing: Not a known field, kept.", {}, None),
        id="nameless-param-and-unknown-field",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), SPHINX_CASES)
def test_sphinx_style(doc: str, expected: ParsedDocstring) -> None:
    """Sphinx/reST field lists are parsed and removed from the description."""
    assert parse_docstring(doc) == expected


# --------------------------------------------------------------------------- mixed


MIXED_CASES = [
    pytest.param(
        """Mixed.

        Args:
            a: Google a.

        :param b: Sphinx b.

        Parameters
        ----------
        c : int
            NumPy c.
        """,
        ParsedDocstring("Mixed.", {"a": "Google a.", "b": "Sphinx b.", "c": "NumPy c."}, None),
        id="all-three-styles",
    ),
    pytest.param(
        """Mixed.

        Args:
            a: First description wins.

        :param a: Ignored duplicate.
        :returns: First returns.

        Returns:
            Second returns ignored.
        """,
        ParsedDocstring("Mixed.", {"a": "First description wins."}, "First returns."),
        id="first-wins",
    ),
    pytest.param(
        """Mixed.

        Intro paragraph.

        Raises:
            KeyError: Bad key.

        Middle paragraph.

        Args:
            a: An a.

        Closing paragraph.
        """,
        ParsedDocstring(
            "Mixed.\n\nIntro paragraph.\n\nMiddle paragraph.\n\nClosing paragraph.",
            {"a": "An a."},
            None,
        ),
        id="paragraphs-around-sections",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), MIXED_CASES)
def test_mixed_sections(doc: str, expected: ParsedDocstring) -> None:
    """Sections of different styles can be combined in one docstring."""
    assert parse_docstring(doc) == expected


@pytest.mark.parametrize(
    "section",
    [
        pytest.param("Args:\n    x: SECRET", id="google-args"),
        pytest.param("Raises:\n    ValueError: SECRET", id="google-raises"),
        pytest.param("Parameters\n----------\nx : int\n    SECRET", id="numpy-params"),
        pytest.param("Notes\n-----\nSECRET", id="numpy-notes"),
        pytest.param(":param x: SECRET", id="sphinx-param"),
        pytest.param(":raises ValueError: SECRET", id="sphinx-raises"),
    ],
)
def test_section_text_not_in_description(section: str) -> None:
    """No section body ever leaks into the description."""
    parsed = parse_docstring(f"Summary.\n\n{section}\n")
    assert parsed.description == "Summary."
    assert "SECRET" not in parsed.description


# --------------------------------------------------------------------------- fuzzing


SECTION_LINES = [
    "Args:",
    "Arguments:",
    "Returns:",
    "Returns: x",
    "Yields:",
    "Raises:",
    "Example:",
    "Parameters",
    "Returns",
    "Notes",
    "----------",
    "---",
    "    x: desc",
    "    x (int): desc",
    "    x (int: desc",
    "    *args: desc",
    "        more",
    "x : int",
    "x, y : int",
    "\\*\\*kwargs",
    ":param x: desc",
    ":param int x:",
    ":param:",
    ":returns: r",
    ":type x: int",
    ":raises ValueError:",
    ":class:`Foo`",
    "",
    "\t",
    "Summary.",
]

docstring_text = st.one_of(
    st.text(),
    st.lists(
        st.one_of(st.sampled_from(SECTION_LINES), st.text(max_size=20)),
        max_size=25,
    ).map("\n".join),
)


def _check_types(parsed: ParsedDocstring) -> None:
    assert isinstance(parsed, ParsedDocstring)
    assert isinstance(parsed.description, str)
    assert parsed.description == parsed.description.strip()
    assert isinstance(parsed.params, dict)
    for name, text in parsed.params.items():
        assert isinstance(name, str)
        assert name
        assert isinstance(text, str)
        assert text
    assert parsed.returns is None or isinstance(parsed.returns, str)


@settings(max_examples=500, deadline=None)
@given(docstring_text)
def test_fuzz_never_raises(doc: str) -> None:
    """Any text parses without raising and with correctly typed fields."""
    _check_types(parse_docstring(doc))
    # The internal parser must not rely on the defensive fallback either.
    if doc.strip():
        _check_types(_docstrings._parse(doc))


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[A-Z][a-z]{1,10}( [a-z]{1,10}){0,5}\.", fullmatch=True),
    st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), unique=True, max_size=5),
)
def test_fuzz_google_roundtrip(summary: str, names: list[str]) -> None:
    """Generated Google docstrings round-trip their summary and parameters."""
    lines = [summary, "", "Args:"]
    lines += [f"    {name} (int): About {name}." for name in names]
    parsed = parse_docstring("\n".join(lines))
    assert parsed.description == summary
    assert parsed.params == {name: f"About {name}." for name in names}
    assert parsed.returns is None
