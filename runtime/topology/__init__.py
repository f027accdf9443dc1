"""Tree math and its constants: the chain, organize, static tree choices, the verify tree and the
topology buffers a static layout keeps on its device."""
