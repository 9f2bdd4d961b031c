"""Dicts whose keys read as attributes too, as Transformers' `BatchEncoding` and `ModelOutput` do."""


class AttrDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None
