//! Nothing here: the tests in this package check repository files.
