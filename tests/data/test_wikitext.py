import pytest

from tokenmix.data import load_data
from tokenmix.data.sources import source_kind

ARTICLE = " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing game . \n"


def write_release(folder, variant="tokens"):
    folder.mkdir(parents=True, exist_ok=True)
    texts = {
        "train": ARTICLE * 3,
        "valid": " = Tower Building = \n The tower rose . \n",
        "test": " = Robert Boulter = \n He is an actor . \n",
    }
    for name, text in texts.items():
        (folder / f"wiki.{name}.{variant}").write_text(text, encoding="utf-8")
    return texts


@pytest.mark.parametrize("variant", ["tokens", "raw"])
@pytest.mark.parametrize("nested", ["", "wikitext-103"])
def test_wikitext_splits_are_the_release_files_bytes_in_order(tmp_path, variant, nested):
    texts = write_release(tmp_path / nested, variant)
    source = f"wikitext:{tmp_path}" + ("" if variant == "tokens" else ":variant=raw")
    corpus = load_data(source, 512)
    for split, name in (("train", "train"), ("val", "valid"), ("test", "test")):
        assert bytes(corpus.split(split).tolist()) == texts[name].encode("utf-8")
    assert corpus.vocab_size == 256 and source_kind(source) == "corpus"


def test_wikitext_names_the_missing_file_and_the_layout(tmp_path):
    write_release(tmp_path)
    (tmp_path / "wiki.valid.tokens").unlink()
    with pytest.raises(ValueError, match=r"wiki.valid.tokens is missing; expected the WikiText release files"):
        load_data(f"wikitext:{tmp_path}", 512)
    with pytest.raises(ValueError, match="needs the directory of its files"):
        load_data("wikitext", 512)
    with pytest.raises(ValueError, match=r"variant must be one of \['tokens', 'raw'\]"):
        load_data(f"wikitext:{tmp_path}:variant=bpe", 512)
    with pytest.raises(ValueError, match="unknown options"):
        load_data(f"wikitext:{tmp_path}:size=3", 512)
