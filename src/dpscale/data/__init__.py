"""Fashion-MNIST: the data stage (fetch: a local copy, Debian's package, the mirrors or
a labelled synthetic stand-in; resize: the cache both frameworks read) and what a
measurement reads of it (load). Layout under the data folder (torchvision's own, so
`datasets.FashionMNIST(root)` reads it unchanged for the book's DataLoader path):

    FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    source.json                      provenance: real | local | synthetic, checksums
    fmnist_{size}.npz / .json        resize cache + its sha256 and provenance
"""
