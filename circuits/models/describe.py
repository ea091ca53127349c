def describe(c):
    raise NotImplementedError
