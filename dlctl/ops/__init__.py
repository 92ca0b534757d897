"""Operations: each builds a plan or a result from the library; the CLI renders them."""
