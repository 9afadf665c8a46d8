"""Task synthesis by running code: SWE task sets built from real PyPI packages (a mutant of a covered
function body is kept only when some of the package's own tests fail on it and the rest pass). It sits
above `tasks/` (the records it writes are Tasks), `sandbox/` (where the tests run) and `verifiers/`;
`sleuth tasks build-swe` drives it."""
