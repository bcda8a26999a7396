"""The unseen matrices of ``bench/unseen.py`` (issue #18): the benchmark's own generators, sets g on in no corpus.

The generators here are this benchmark's own: no corpus suite and no test was built from them, and no
shipped selector learned from them until stop 78, when the H200's corpus took those of sets a to f
(:data:`GROWN`), so the figures say how ``plan()`` does on structures outside what it learned. Each matrix has
at least 10 M nonzeros:

- ``rgg``: a random geometric graph in the unit square (neighbours within a
  radius, about 14 a vertex), vertices in strips: irregular rows, local columns;
- ``communities``: 256 communities of log-normal sizes, log-normal degrees,
  85 % of the edges inside a vertex's community: dense diagonal blocks and noise;
- ``blockdiag``: dense diagonal blocks of 1 to 400 rows (log-uniform): row
  lengths equal within a block, wildly different across;
- ``perm27``: a 27-point 3-D stencil under a random symmetric permutation:
  27 entries a row, no column locality at all;
- ``skyline``: each row a contiguous run ending at the diagonal, of a heavy-tailed
  length (an envelope / profile matrix);
- ``bursts``: 90 % empty rows, the others in bursts of heavy-tailed lengths whose
  columns cluster around the burst's centre.

Set ``b``, added at stop 37 after the selectors, the race and its rules were
settled on set ``a`` (so nothing was tuned to them):

- ``incidence``: the edge-by-vertex incidence matrix of a random graph, edges
  in source order: tall (10 edges a vertex), exactly 2 entries a row;
- ``hubcols``: square, 4 to 8 entries a row, columns drawn from a Zipf law and
  scattered by a random permutation: a few x entries read by many rows;
- ``diagonals``: 11 wrapped diagonals at random offsets (a circulant pattern):
  equal rows, 11 streams of x far apart;
- ``denserows``: 4,000 rows of 4,000 random columns out of 2 M: few, long,
  equal rows of a very wide matrix;
- ``sawtooth``: row lengths 1, 2, ..., 64 over and over, columns within 2,000
  of the diagonal;
- ``kkt``: a saddle-point matrix [[K, Bᵀ], [B, 0]], K the 7-point 3-D Laplacian,
  B a quarter as many rows of 24 entries near a random centre: stencil rows,
  ragged rows and an empty block.

Set ``c``, added at stop 45, when a matrix like it showed rcm's preparation
(a read-back a breadth-first level) costing a race 1,500-6,900 SpMVs:

- ``mesh2d``: a 2-D mesh of bilinear quadrilaterals (each node coupled to its 8
  neighbours, a 9-point pattern), nodes numbered at random: regular rows, no
  column locality, and a breadth-first search of 1,200 levels.

Set ``d``, added at stop 46 after the race on sets a to c was settled, and measured only as it came (nothing
was changed for it):

- ``fem3x3``: 3 unknowns a node on the 7-point pattern of a 3-D grid (dense 3 x 3
  blocks), nodes numbered at random: 21 entries a row in 7 runs of 3 columns far apart;
- ``scatterwide``: 1 M rows of 12 random columns out of 32 M: x of 256 MB (float64),
  every gather a random read of DRAM;
- ``densepanel``: a tall dense panel, 1 M rows x 32 columns, every entry stored:
  equal rows, all reading the same 32 entries of x;
- ``mixedrows``: a tridiagonal matrix whose rows are, one in twenty at random, 300
  random columns instead: short and long rows side by side in every warp.

Set ``e``, added at stop 49 when the race, the selectors and #18's figures on sets a to d were settled, and
measured only as it came (nothing was changed for it):

- ``road``: a road-like network, a 2-D grid of which 70 % of the street segments are kept and 0.5 % of the
  crossings get a random shortcut, numbered tile by tile (64 x 64): 1 to 7 entries a row (3.8 on average),
  mostly local;
- ``restrict3d``: the full-weighting restriction of a multigrid cycle, a (2c)^3 fine grid onto a c^3 coarse one:
  wide (8 times as many columns as rows), 27 entries a row in 9 runs of 3, the runs a fine plane and a fine line apart;
- ``prolong3d``: its transpose, trilinear interpolation back: tall, 1 to 8 entries a row;
- ``lowertri``: a random lower-triangular matrix whose row i holds about 80 i / n entries anywhere left of
  the diagonal (and the diagonal), as an incomplete factor's rows grow: long rows at the bottom;
- ``bandnoise``: a band of half-width 40 and 3 random columns a row: streaming reads of x but for a few;
- ``tensorprod``: the Kronecker product of a random m x m matrix (4 random columns and the diagonal a row) and
  the 800 x 800 tridiagonal matrix: 15 entries a row in 5 runs of 3 columns far apart.

Set ``f``, added at stop 53 before anything of that stop was changed, and measured as it came (at d25020f):

- ``hypercube``: the hypercube graph, row i holding i XOR 2^b for every bit: about 21 entries a row at offsets of every
  scale from 1 to n / 2;
- ``knn3d``: each of 1.6 M random points in a cube and its 12 nearest neighbours, numbered along a Morton curve;
- ``dense24``: 6,000 x 6,000 in the 2:4 pattern of structured-sparse weights: 3,000 entries in every row, x small;
- ``repeatrows``: every row a copy of one of 64 column patterns of 8 to 256 entries: x read from a few thousand places;
- ``webhosts``: a crawl's links, pages numbered by Zipf-sized hosts, 80 % of the links near the page within its
  host and the rest to other hosts' home pages;
- ``blockangular``: a doubly bordered block-angular LP: 50 diagonal blocks of 8 entries a row, 2,000 linking columns
  every row reads twice, and 400 linking rows of 25,000 entries.

Set ``g``, added at stop 64 before anything of that stop was changed, and measured as it came (at 472d7ac): the
selectors' rules of stops 54 to 63 were chosen while sets a to f were in view, so this set is the first since set
f that none of them saw:

- ``debruijn``: a shift graph, row i linking to 4i + c (mod n) and to i // 4 + c n / 4 for c = 0..3: eight
  entries a row, a run of 4 at 4i (sweeping x four times as fast as the rows) and 4 single columns n / 4 apart;
- ``blocksparse8``: dense 8 x 8 blocks, each block row its diagonal block and 4 at random block columns: 40
  entries a row in 5 runs of 8 far apart;
- ``smallworld``: a ring in which each node links to itself and to 2 nodes within 2^l of it at every scale l (a
  navigable small world): about 40 entries a row at distances of every scale;
- ``rowperm7``: the 7-point 3-D Laplacian with its rows (not its columns) in random order: each row's columns in
  three clusters, consecutive rows far apart;
- ``colruns``: 3 runs of 48 consecutive columns a row at random places (a block-sparse attention pattern): 144
  entries a row, x read in coalesced runs;
- ``staircase``: a multi-period LP, periods of log-normal sizes, each row 6 random columns of its period and 3
  of the period before.

Set ``h``, added at stop 65 after rowsort (rows reordered by their middle columns) was built for set g's
rowperm7, to see it on rows out of order in ways it was not built on, and where it must stay out (three of the
six): measured as it came.

- ``lengthsorted``: a band whose rows are runs of log-uniform length (3 to 60) centred on the diagonal, the rows
  sorted by length as a jagged-diagonal format stores them;
- ``twofield``: two fields on a 3-D grid coupled node by node ([[L, I], [I, L]]), columns field by field, rows
  node by node: each row's columns in two places n / 2 apart, alternating from row to row;
- ``tallshuffled``: bilinear interpolation from a 1000 x 1000 grid to 8 points a cell, the points in random
  order: tall, 4 entries a row in two pairs a grid line apart;
- ``multicolor``: the 27-point stencil in 8-colour order (rows and columns alike), as a multicoloured
  Gauss-Seidel numbers it;
- ``blockshuffled``: the 9-point 2-D stencil with blocks of 512 consecutive rows in random order, columns kept;
- ``rowhash9``: the 9-point 2-D stencil with its rows in the order of a multiplicative hash, columns kept.

Set ``i``, added at stop 65 after rowsort and set h, before anything else was changed, and measured as it came:

- ``groupedrows``: 1 M rows in groups of 32 sharing one set of 24 random columns: scattered gathers, shared by a warp;
- ``denseblock``: the 5-point 2-D Laplacian (4 M rows) with a dense 4,000 x 4,000 block in its corner: 4,000 rows of
  4,000 entries beside millions of 5;
- ``wideclustered``: 40,000 rows of 16 M columns, each 4 runs of 100 columns at random places: x of 128 MB;
- ``hypersparse``: 30 M x 30 M, 60 % of the rows empty, the others 1.25 random columns on average;
- ``globalcols``: 2 M rows each reading the same 16 columns and a band of 5: a few entries of x read by every row;
- ``tallwide``: 1 M x 50 M, each row 10 columns near 50 times its number and 10 anywhere: half the gathers stream,
  half are random reads of an x of 400 MB (float64).

Set ``j``, added at stop 67 before anything of that stop was changed, and measured as it came (at bba4a7f):

- ``zipfrows``: 2 M x 2 M, the row of rank r (ranks at random) 2 M / r random columns long: a Zipf law of row
  lengths, the longest 1.3 M entries, half the rows 1 or 2;
- ``stencil125``: the 125-point stencil (a 5 x 5 x 5 box) of a 62^3 grid in order: 125 entries a row in 25 runs of 5;
- ``vbr3d``: the 7-point pattern of a 70^3 grid of nodes in order, each node 1, 3 or 6 unknowns at random:
  variable blocks, rows of 7 to 42 entries in 7 runs;
- ``onehot``: 24 M x 3 M, one entry a row at a random column (a sampling or embedding-lookup matrix);
- ``antiband``: a band of half-width 4 and the anti-diagonal band beside it: two streams of x in opposite
  directions, 18 entries a row;
- ``subsetcols``: 2 M x 2 M, 12 columns a row drawn from one random subset of 62,500 columns: random gathers
  from a working set of 500 KB (float64) spread over x.

Set ``k``, added at stop 67 after set j's two changes (rowsort's bound, NuT's join), before anything else, and
measured as it came:

- ``fewlongrows``: 64 rows of 250,000 random columns of 30 M: the work in the entries, not the rows;
- ``degreesorted``: a Chung-Lu power-law graph (Pareto degrees) numbered by falling degree, rows and columns: the
  longest rows first, the most read columns first;
- ``ndgrid``: the 9-point stencil of a 1,600^2 grid in nested-dissection order (boxes of 32 x 32 in order, each
  separator after the two halves it parts);
- ``diagonal``: a 24 M x 24 M diagonal matrix (a scaling): one entry a row, everything streamed;
- ``bitrev5``: the 5-point stencil of a 2,000^2 grid in bit-reversed order, rows and columns;
- ``log2rows``: 150,000 rows, each a run of 2^k columns around its diagonal, k uniform in 0..10.

Set ``l``, added at stop 68 before anything of that stop was changed, and measured as it came:

- ``onedenserow``: the 5-point stencil of a 2,000^2 grid with its middle row reading all 4 M columns: one row of a
  sixth of the entries amid rows of 5;
- ``topheavy``: 5 M x 5 M, only the first 100,000 rows filled (100 to 300 columns near 50 times the row), the rest
  empty;
- ``lattice4d``: a periodic 12^4 lattice, 12 unknowns a site, each site coupled to itself and its 8 neighbours by
  dense 12 x 12 blocks (a lattice QCD pattern): 108 entries a row in 9 runs of 12;
- ``termdoc``: 1 M documents x 8 M terms, log-normal lengths, terms from a Zipf law numbered by frequency: wide, most
  reads in x's head;
- ``everyother``: 1.2 M rows, the even ones empty, each odd one a run of 40 columns around its diagonal;
- ``cliques``: the clique expansion of a random hypergraph (each of 400,000 vertices in 2 hyperedges of 30): 59
  entries a row at random columns, each set of 30 columns read by 30 rows far apart.

Set ``m``, added at stop 68 after set l's three changes (narrow columns' long rows, NuT's join tile, csr5's second
sigma), before anything else, and measured as it came:

- ``blocktri``: block tridiagonal with dense 48 x 48 blocks (3,500 a side): each row one run of 144 columns;
- ``randperm``: a 24 M x 24 M random permutation matrix: one entry a row, x of 192 MB (float64) read at random;
- ``window``: 800,000 rows of 30 random columns within a window of 4,096 at a random place: narrow rows, scattered;
- ``useritem``: 3 M users x 750,000 items, Pareto user degrees, Zipf item popularity, items numbered at random;
- ``mediumwide``: 24,000 rows of 1,000 random columns of 20 M (fewlongrows' generator, shorter rows, more of them);
- ``upper27``: the upper triangle of the 27-point stencil of a 120^3 grid in order (symmetric storage).

Set ``n``, added at stop 69 before anything of that stop was changed, and measured as it came:

- ``widestencil``: each node of a 36^3 grid in order coupled to its whole 9^3 box (wide-support kernels, high-order
  elements): about 600 entries a row in runs of 9;
- ``morton27``: the 27-point stencil of a 100^3 grid in Z (Morton) order, rows and columns;
- ``colperm27``: the same stencil in order, the columns alone randomly permuted: 27 random columns a row,
  neighbouring rows sharing 18;
- ``invertedindex``: the transpose of a term-document matrix (4.8 M terms by frequency x 1.2 M documents): a row of
  770,000 entries first, more than half the rows empty;
- ``cutoff3d``: 80,000 points in a cube, each coupled to the ~270 within a cutoff radius, numbered by cell;
- ``groupby``: a group-by sum, 360,000 groups of log-normal sizes over 24 M records sorted by group: each row one
  run, each column read once.

Set ``o``, added at stop 70 before anything of that stop was changed, and measured as it came:

- ``prunedlayer``: a 16,384^2 weight matrix pruned at random to 10 % (a neural network layer): rows of about 1,560
  random columns, all within an x of 128 KB (float64);
- ``twofour``: a 7,168^2 weight matrix in 2:4 structured sparsity: rows of 3,584, 2 of every 4 neighbouring columns;
- ``spectralz``: an 80 x 80 x 64 grid, finite differences in x and y and a spectral method along z (fastest): a run
  of 64 and 4 far singles a row;
- ``erdos``: 100,000 vertices, 250 uniformly random columns a row: long rows, random gathers within the L2;
- ``wideband``: a fully stored band of half-width 400 on 30,000 rows: one run of 801 columns a row;
- ``randblocks``: dense blocks of 4 to 64 rows at random places (7,200 block rows, each its diagonal block and 6
  others): a few runs of 4 to 64 columns a row, far apart.

Set ``p``, added at stop 71 before anything of that stop was changed, and measured as it came:

- ``hmatrix``: a hierarchical (H-matrix) pattern: a run of 32 about the diagonal and one column at each distance
  2^k either side;
- ``circuit``: a circuit's nodal analysis: short local rows, 20 supply nets at random places with rows and columns
  of about 175,000 entries;
- ``tridiag``: 8 M rows of three;
- ``dgblocks``: a discontinuous Galerkin operator of order 3 on 13^3 hexahedra: dense blocks of 64 and face blocks
  of 16, up to 160 entries a row in 27 runs;
- ``transposed5``: a 5-point stencil with column-major columns: x read at a stride of 2,200;
- ``bigbird``: a sparse attention mask: a window of 64, 8 global tokens with whole rows and columns, 48 random
  columns a row.

Set ``q``, added at stop 72 before anything of that stop was changed, and measured as it came:

- ``spinchain``: the Heisenberg chain's Hamiltonian on 21 spins (2 M states): its diagonal and one entry for each
  antiparallel neighbouring pair, at power-of-two offsets (11.5 a row on average, binomial);
- ``dilated``: a dilated convolution on a 1,000^2 image, 3 x 3 kernels at dilations 1, 4 and 16: 25 entries a row
  in 9 runs over 7 image rows;
- ``sellslices``: 300,000 x 3 M, each slice of 32 rows one length (log-uniform 1 to 512 across slices), columns
  uniformly random;
- ``interleaved``: even rows a run of 9 about the diagonal, odd rows 40 random columns;
- ``citations``: a citation graph in publication order (strictly lower triangular), 20 citations a paper, half
  among the 2,000 papers before it, half skewed to the oldest;
- ``torus3d``: the 7-point Laplacian on a 150^3 periodic grid: a face's rows also read the opposite face.

Set ``r``, added at stop 73 before anything of that stop was changed, and measured as it came:

- ``reactdiff``: a reaction-diffusion Jacobian, 20 species a node of a 230^2 grid numbered node by node: a run of 20
  (the node's reactions) and 4 singles 20 and 4,600 columns away (diffusion), 24 entries a row;
- ``patree``: the Laplacian of a random tree of 8 M nodes grown in order, node i hanging from node i u^2: 3 entries a
  row on average, power-law degrees (the first rows thousands long), each row reading its parent far back;
- ``kronrandom``: the Kronecker product of two random 1,000^2 matrices of 5 a row: up to 25 entries a row in 5
  clusters, each 5 random columns of a window of 1,000;
- ``sparseblocks``: 30,000 independent 64 x 64 blocks at 20 % density (a batch of small systems): about 13 random
  columns a row within the row's own 64;
- ``tandemqueue``: the generator of a Markov chain of 5 queues in tandem, 20 places each (4 M states): up to 7
  entries a row at fixed offsets from 1 to 21^4, fewer at the boundaries;
- ``levy``: a Levy flight's jumps on a ring of 2 M, 16 drawn a row (11.7 distinct): 41 % within 4 columns of the
  diagonal, 4 % beyond 1,000, 0.4 % beyond 100,000.

Set ``s``, added at stop 74 after the selector's second opinion on csr5 (what ``tuner recommend`` answers) and
measured once as it came:

- ``matricized``: a sparse 3-way tensor unfolded along its first mode, 1 M x 20 M: each row 4 slices (Zipf over
  2,000, the hot ones anywhere) of 6 random fibre entries each, clusters of 6 columns in windows of 10,000;
- ``maxwell``: the curl-curl operator plus identity on a periodic 85^3 Yee grid, numbered field by field: 13 entries
  a row, 5 in its own field's third of x and 4 in each of the other two;
- ``haar``: the Haar wavelet synthesis of 1.1 M samples (1.1 M x 2.2 M): one column in each of 22 level sections a
  row, the coarse sections shared by runs of rows;
- ``conv3dch``: a 3 x 3 x 3 convolution of a 16^3 volume of 16 channels, channels fastest: 27 runs of 16 columns a
  row (432 inside), x of 65,536;
- ``driftband``: 20 columns a row within 100 of a centre that random-walks away from the diagonal and back;
- ``supernodal``: a Cholesky factor's pattern by rows, supernodes of 8 to 64 rows each reading 10 to 40 shared far
  columns and its own lower triangle: row lengths rising through each supernode.

Set ``t``, added at stop 75 (after a replay of derived features for the selector, none kept; nothing of
``plan()`` changed) and measured once as it came:

- ``exactcover``: the exact-cover matrix of a 180 x 180 Sudoku (boxes of 12 x 15), 5.8 M x 129,600: one column
  in each of four constraint sections a row (cell, row-value, column-value, box-value), each section read in its
  own stride;
- ``resample``: a decimation filter, 1.5 M x 6 M: 16 consecutive columns a row, each row 4 columns on from the
  one before (x read 4 times over, nearby);
- ``subdomains``: the 7-point Laplacian of a 160^3 grid numbered subdomain by subdomain (4 x 4 x 4 of 40^3, each
  lexicographic inside): local rows, a subdomain's face rows reading the next one 1, 4 or 16 subdomains (of 64,000
  rows) on;
- ``tomography``: a parallel-beam CT projector, 24,000 rays (angle by angle) across a 1,000^2 image: rows of
  about 1,000 pixels along a line, runs of consecutive columns or a stride of 1,000 as the angle turns;
- ``gnnsample``: a graph network's sampled neighbourhoods, 1 M x 8 M: 25 neighbours drawn a row, popular nodes
  (Zipf 0.8) anywhere in x;
- ``dangling``: a web crawl's link matrix, 4 M pages of which 80 % uncrawled (empty rows): log-normal out-degrees
  (median 20), half the links near the page (its host), half to popular pages anywhere.

Set ``u``, added at stop 76 (nothing of ``plan()``, the kernels or the selectors changed since stop 74) and
measured once as it came:

- ``ghostcols``: one process's rows of a distributed 7-point Laplacian, 150^3 lexicographic, 3.4 M x 3.5 M: its
  own columns, then its six neighbours' face unknowns (ghosts) face by face: local rows, a face row one far column;
- ``amr3d``: finite volumes on an adaptively refined 3-D mesh, a 106^3 grid with the cells near a sphere split in
  eight (3.3 M cells), Z order: 4 to 16 entries a row, four finer neighbours across a refined face;
- ``specelem``: 2-D spectral elements of order 7, 75 x 75 elements numbered element by element: 64 entries a
  row inside an element, 120 on an edge, 225 at a corner, in runs of 8;
- ``molecules``: a graph network's batch of small molecules (10-60 atoms, rings, atoms numbered at random within
  a molecule), 7.3 M atoms: block diagonal, 3 entries a row, a molecule's columns within 60;
- ``coupled``: two physics in one matrix: a 27-point 3-D stencil (78^3 rows) over a network of as many rows of
  log-normal lengths (median 8, up to some 10,000) with random columns anywhere;
- ``stochgalerkin``: a stochastic Galerkin matrix, a 107^2 grid's 5-point Laplacian through a polynomial chaos of
  degree 3 in 6 inputs (84 polynomials), polynomial by polynomial: a row 2 to 9 stencils a grid apart.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.matrix.generate import generate  # noqa: E402
from tuner.matrix.io import as_csr  # noqa: E402
from tuner.matrix.suites import SuiteMatrix, suite  # noqa: E402


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(0.1, 1.0, n) * np.where(rng.random(n) < 0.5, -1.0, 1.0)


def _csr(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], rng: np.random.Generator) -> sp.csr_matrix:
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=shape)
    A.sum_duplicates()
    A.data = _values(rng, A.nnz)
    return A


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated runs ``starts[k], starts[k] + 1, ..., starts[k] + lengths[k] - 1``."""
    first = np.cumsum(lengths) - lengths
    return np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()))


def rgg(n: int, rng: np.random.Generator, degree: float = 14.0) -> sp.csr_matrix:
    """Random geometric graph: n points in the unit square, an edge within radius sqrt(degree / (pi n))."""
    from scipy.spatial import cKDTree

    r = math.sqrt(degree / (math.pi * n))
    pts = rng.random((n, 2))
    strip = np.floor(pts[:, 1] / r)
    pts = pts[np.lexsort((pts[:, 0], strip))]  # strips of height r, left to right: local columns
    pairs = cKDTree(pts).query_pairs(r, output_type="ndarray")
    i, j = pairs[:, 0], pairs[:, 1]
    diag = np.arange(n)
    return _csr(np.concatenate([i, j, diag]), np.concatenate([j, i, diag]), (n, n), rng)


def communities(n: int, rng: np.random.Generator, k: int = 256, degree: float = 20.0,
                inside: float = 0.85) -> sp.csr_matrix:
    """k communities of log-normal sizes, log-normal degrees, ``inside`` of the edges within the community."""
    sizes = rng.lognormal(0.0, 1.0, k)
    bounds = np.concatenate([[0], np.round(np.cumsum(sizes) / sizes.sum() * n).astype(np.int64)])
    bounds[-1] = n
    deg = np.maximum(1, np.round(rng.lognormal(np.log(degree) - 0.5, 1.0, n))).astype(np.int64)
    rows = np.repeat(np.arange(n), deg)
    comm = np.searchsorted(bounds, rows, side="right") - 1
    lo, hi = bounds[comm], np.maximum(bounds[comm + 1], bounds[comm] + 1)
    local = rng.random(rows.size) < inside
    cols = np.where(local, lo + (rng.random(rows.size) * (hi - lo)).astype(np.int64), rng.integers(0, n, rows.size))
    return _csr(rows, cols, (n, n), rng)


def blockdiag(n: int, rng: np.random.Generator, largest: int = 400) -> sp.csr_matrix:
    """Dense diagonal blocks of log-uniform sizes in [1, largest], filling n rows."""
    sizes = []
    total = 0
    while total < n:
        b = min(int(np.exp(rng.uniform(0.0, np.log(largest)))), n - total)
        sizes.append(max(b, 1))
        total += sizes[-1]
    blocks = [np.ones((b, b)) for b in sizes]
    A = sp.block_diag(blocks, format="csr")
    A.data = _values(rng, A.nnz)
    return A


def _box_stencil(side: int, dims: int, radius: int = 1) -> sp.csr_matrix:
    """Each node of a side^dims grid coupled to every node of its (2 ``radius`` + 1)^dims box (with radius 1 the
    9-point pattern in 2-D, the 27-point one in 3-D), in order."""
    offsets = list(range(-radius, radius + 1))
    path = sp.diags([1.0] * len(offsets), offsets, shape=(side, side), format="csr")
    return functools.reduce(lambda a, b: sp.kron(a, b, format="csr"), [path] * dims)


def _reordered(A: sp.spmatrix, rows: np.ndarray, rng: np.random.Generator, cols: np.ndarray | None = None
               ) -> sp.csr_matrix:
    """``A[rows]`` (and ``[:, cols]`` where given), with values drawn from ``rng``."""
    A = A[rows] if cols is None else A[rows][:, cols]
    A = A.tocsr()
    A.data = _values(rng, A.nnz)
    return A


def _box_stencil_at_random(side: int, dims: int, rng: np.random.Generator) -> sp.csr_matrix:
    """:func:`_box_stencil`, rows and columns under one random permutation."""
    p = rng.permutation(side**dims)
    return _reordered(_box_stencil(side, dims), p, rng, p)


def perm27(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 27-point stencil on a side^3 grid, rows and columns under one random permutation."""
    return _box_stencil_at_random(side, 3, rng)


def skyline(n: int, rng: np.random.Generator, typical: int = 12, tail: float = 1.6, longest: int = 4000
            ) -> sp.csr_matrix:
    """Row i: the contiguous run of columns ending at i, of length typical * Pareto(tail), capped."""
    lengths = np.minimum(np.floor(typical * (1.0 + rng.pareto(tail, n))).astype(np.int64), longest)
    lengths = np.minimum(lengths, np.arange(n) + 1)
    rows = np.repeat(np.arange(n), lengths)
    return _csr(rows, _runs(np.arange(n) - lengths + 1, lengths), (n, n), rng)


def bursts(n: int, rng: np.random.Generator, filled: float = 0.1, tail: float = 1.3, longest: int = 50_000
           ) -> sp.csr_matrix:
    """``filled`` of the rows non-empty, in bursts of about 64 rows; heavy-tailed lengths; each burst's
    columns normal around its own centre (sd 2 % of the columns)."""
    burst = 64
    starts = np.flatnonzero(rng.random(n // burst) < filled) * burst
    rows_nz = (starts[:, None] + np.arange(burst)).ravel()
    lengths = np.minimum(np.floor(2 * (1.0 + rng.pareto(tail, rows_nz.size))).astype(np.int64), longest)
    centre = np.repeat(rng.random(starts.size) * n, burst)
    rows = np.repeat(rows_nz, lengths)
    cols = np.repeat(centre, lengths) + rng.normal(0.0, 0.02 * n, rows.size)
    return _csr(rows, np.clip(cols, 0, n - 1).astype(np.int64), (n, n), rng)


def incidence(n: int, rng: np.random.Generator, ratio: int = 10) -> sp.csr_matrix:
    """``ratio`` x n edges between random vertices, sorted by source: row e has +-1 at its two ends."""
    u = np.sort(rng.integers(0, n, ratio * n))
    v = (u + rng.integers(1, n, u.size)) % n
    rows = np.repeat(np.arange(u.size), 2)
    return _csr(rows, np.column_stack([u, v]).ravel(), (u.size, n), rng)


def hubcols(n: int, rng: np.random.Generator, zipf: float = 1.1) -> sp.csr_matrix:
    """4 to 8 entries a row, each column a Zipf(``zipf``) rank on [1, n] sent through a random permutation."""
    degrees = rng.integers(4, 9, n)
    s = 1.0 - zipf
    rank = ((n**s - 1.0) * rng.random(int(degrees.sum())) + 1.0) ** (1.0 / s)
    cols = rng.permutation(n)[np.minimum(rank.astype(np.int64) - 1, n - 1)]
    return _csr(np.repeat(np.arange(n), degrees), cols, (n, n), rng)


def diagonals(n: int, rng: np.random.Generator, k: int = 11) -> sp.csr_matrix:
    """The main diagonal and k - 1 others at random offsets, wrapped around (column (i + offset) mod n)."""
    offsets = np.concatenate([[0], rng.integers(1, n, k - 1)])
    rows = np.repeat(np.arange(n), k)
    return _csr(rows, (rows + np.tile(offsets, n)) % n, (n, n), rng)


def denserows(rows: int, rng: np.random.Generator, cols: int = 2_000_000, length: int = 4000) -> sp.csr_matrix:
    """``rows`` rows of ``length`` random columns (of ``cols``) each."""
    return _csr(np.repeat(np.arange(rows), length), rng.integers(0, cols, rows * length), (rows, cols), rng)


def sawtooth(n: int, rng: np.random.Generator, period: int = 64, width: int = 2000) -> sp.csr_matrix:
    """Row i has (i mod ``period``) + 1 entries, columns uniform within ``width`` of i (fewer where a column is
    drawn twice, as near the first rows, whose columns are clipped at 0)."""
    lengths = np.arange(n) % period + 1
    rows = np.repeat(np.arange(n), lengths)
    cols = np.clip(rows + rng.integers(-width, width + 1, rows.size), 0, n - 1)
    return _csr(rows, cols, (n, n), rng)


def mesh2d(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 9-point pattern on a side^2 grid (each node, its 8 neighbours and itself), rows and columns under one
    random permutation."""
    return _box_stencil_at_random(side, 2, rng)


def kkt(n: int, rng: np.random.Generator, constraint: int = 24) -> sp.csr_matrix:
    """[[K, B^T], [B, 0]]: K the 7-point Laplacian on a side^3 grid (side^3 about n), B n // 4 rows of
    ``constraint`` entries (a column drawn twice counted once) normal around a random centre (sd 1 % of K's
    rows, wrapped around)."""
    side = max(2, round(n ** (1 / 3)))
    K = generate("poisson3d", n=side)
    m, size = max(1, side**3 // 4), side**3
    rows = np.repeat(np.arange(m), constraint)
    cols = np.floor(np.repeat(rng.random(m) * size, constraint) + rng.normal(0.0, 0.01 * size, rows.size)
                    ).astype(np.int64) % size
    B = _csr(rows, cols, (m, size), rng)
    A = sp.bmat([[K, B.T], [B, None]], format="csr")
    A.data = _values(rng, A.nnz)
    return A


def fem3x3(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Dense 3 x 3 blocks on the 7-point pattern of a side^3 grid of nodes, nodes under a random permutation, a
    node's 3 unknowns numbered together."""
    nodes = generate("poisson3d", n=side).tocoo()
    p = rng.permutation(side**3)
    renumbered = sp.coo_matrix((nodes.data, (p[nodes.row], p[nodes.col])), shape=nodes.shape)
    A = sp.kron(renumbered, np.ones((3, 3)), format="csr")
    A.sum_duplicates()
    A.data = _values(rng, A.nnz)
    return A


def scatterwide(rows: int, rng: np.random.Generator, cols: int = 32_000_000, per_row: int = 12) -> sp.csr_matrix:
    """``rows`` rows of ``per_row`` uniformly random columns (of ``cols``; a column drawn twice counted once)."""
    return _csr(np.repeat(np.arange(rows), per_row), rng.integers(0, cols, rows * per_row), (rows, cols), rng)


def densepanel(rows: int, rng: np.random.Generator, width: int = 32) -> sp.csr_matrix:
    """Every entry of a ``rows`` x ``width`` matrix."""
    return _csr(np.repeat(np.arange(rows), width), np.tile(np.arange(width), rows), (rows, width), rng)


def mixedrows(n: int, rng: np.random.Generator, long_share: float = 0.05, long: int = 300) -> sp.csr_matrix:
    """A tridiagonal n x n matrix, but a ``long_share`` of its rows, drawn at random, hold ``long`` random columns
    instead (a column drawn twice counted once)."""
    is_long = rng.random(n) < long_share
    lengths = np.where(is_long, long, 3)
    rows = np.repeat(np.arange(n), lengths)
    offsets = np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths) - 1  # -1, 0, 1 in short rows
    cols = np.where(is_long[rows], rng.integers(0, n, rows.size), rows + offsets)
    keep = (cols >= 0) & (cols < n)
    return _csr(rows[keep], cols[keep], (n, n), rng)


def road(side: int, rng: np.random.Generator, kept: float = 0.7, shortcuts: float = 0.005,
         tile: int = 64) -> sp.csr_matrix:
    """A side x side grid of crossings; each street segment (to the right and down) kept with probability ``kept``,
    a ``shortcuts`` share of the crossings joined to a random one; symmetric, with the diagonal; crossings
    numbered tile by tile (``tile`` x ``tile``), row-major inside a tile."""
    n = side * side
    i, j = np.divmod(np.arange(n), side)
    tiles_across = -(-side // tile)
    number = ((i // tile) * tiles_across + j // tile) * tile * tile + (i % tile) * tile + j % tile
    number = np.argsort(np.argsort(number))  # 0..n-1, in tile order
    right = np.flatnonzero((j < side - 1) & (rng.random(n) < kept))
    down = np.flatnonzero((i < side - 1) & (rng.random(n) < kept))
    far = rng.choice(n, int(shortcuts * n), replace=False)
    a = np.concatenate([right, down, far])
    b = np.concatenate([right + 1, down + side, rng.integers(0, n, far.size)])
    rows = number[np.concatenate([a, b, np.arange(n)])]
    cols = number[np.concatenate([b, a, np.arange(n)])]
    return _csr(rows, cols, (n, n), rng)


def restrict3d(coarse: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Full weighting from the (2 coarse)^3 fine grid to the coarse^3 grid: coarse point (i, j, k) averages the fine
    points (2i + a, 2j + b, 2k + c), a, b, c in {-1, 0, 1}, inside the grid; both grids numbered lexicographically."""
    fine = 2 * coarse
    ci, cj, ck = (g.ravel() for g in np.meshgrid(*[np.arange(coarse)] * 3, indexing="ij"))
    rows, cols = [], []
    for a in (-1, 0, 1):
        for b in (-1, 0, 1):
            for c in (-1, 0, 1):
                x, y, z = 2 * ci + a, 2 * cj + b, 2 * ck + c
                inside = (x >= 0) & (y >= 0) & (z >= 0)  # 2 (coarse - 1) + 1 < fine: never past the far side
                rows.append(((ci * coarse + cj) * coarse + ck)[inside])
                cols.append(((x * fine + y) * fine + z)[inside])
    return _csr(np.concatenate(rows), np.concatenate(cols), (coarse**3, fine**3), rng)


def prolong3d(coarse: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The transpose of :func:`restrict3d`: interpolation from the coarse grid back to the fine one."""
    return restrict3d(coarse, rng).T.tocsr()


def lowertri(n: int, rng: np.random.Generator, mean: float = 40.0) -> sp.csr_matrix:
    """Row i: the diagonal and Poisson(2 ``mean`` i / n) columns uniform in [0, i) (a column drawn twice counted
    once)."""
    lengths = rng.poisson(2 * mean * np.arange(n) / n)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.floor(rng.random(rows.size) * rows).astype(np.int64)
    return _csr(np.concatenate([rows, np.arange(n)]), np.concatenate([cols, np.arange(n)]), (n, n), rng)


def bandnoise(n: int, rng: np.random.Generator, half_width: int = 40, noise: int = 3) -> sp.csr_matrix:
    """The band |i - j| <= ``half_width`` and ``noise`` uniformly random columns a row (a column drawn twice
    counted once)."""
    band = np.arange(-half_width, half_width + 1)
    rows = np.repeat(np.arange(n), band.size)
    cols = rows + np.tile(band, n)
    keep = (cols >= 0) & (cols < n)
    extra = np.repeat(np.arange(n), noise)
    return _csr(np.concatenate([rows[keep], extra]), np.concatenate([cols[keep], rng.integers(0, n, extra.size)]),
                (n, n), rng)


def tensorprod(m: int, rng: np.random.Generator, k: int = 800, per_row: int = 4) -> sp.csr_matrix:
    """kron(A, T): A m x m with the diagonal and ``per_row`` random columns a row (a column drawn twice counted
    once), T the k x k tridiagonal matrix."""
    rows = np.repeat(np.arange(m), per_row)
    A = _csr(np.concatenate([rows, np.arange(m)]), np.concatenate([rng.integers(0, m, rows.size), np.arange(m)]),
             (m, m), rng)
    T = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(k, k), format="csr")
    B = sp.kron(A, T, format="csr")
    B.data = _values(rng, B.nnz)
    return B


def hypercube(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The hypercube graph on n vertices: row i holds i and i XOR 2^b for every bit b where that is below n: about
    log2(n) + 1 entries a row, at offsets 1, 2, 4, ... up to n / 2 (every scale of distance at once)."""
    i = np.arange(n, dtype=np.int64)
    bits = 1 << np.arange(max(1, int(n - 1).bit_length()), dtype=np.int64)
    rows, cols = np.repeat(i, bits.size), (i[:, None] ^ bits[None, :]).ravel()
    keep = cols < n
    return _csr(np.concatenate([rows[keep], i]), np.concatenate([cols[keep], i]), (n, n), rng)


def knn3d(n: int, rng: np.random.Generator, k: int = 12) -> sp.csr_matrix:
    """n random points in the unit cube numbered along a Z-order (Morton) curve; row i: point i and its ``k``
    nearest neighbours (not symmetric): a point cloud's operator, local in 3-D, its rows a curve's walk."""
    from scipy.spatial import cKDTree

    pts = rng.random((n, 3))
    cells = np.minimum((pts * 1024).astype(np.uint64), np.uint64(1023))
    code = np.zeros(n, dtype=np.uint64)
    for bit in range(10):  # interleave the 10 bits of each coordinate's cell
        for axis in range(3):
            code |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    pts = pts[np.argsort(code, kind="stable")]
    _, near = cKDTree(pts).query(pts, k=k + 1)
    return _csr(np.repeat(np.arange(n), k + 1), near.ravel(), (n, n), rng)


def dense24(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """An n x n matrix in the 2:4 pattern of structured-sparse weights: in every group of 4 columns of every row,
    2 at random: n / 2 entries a row, equal long rows over a small x."""
    groups = n // 4
    pairs = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])
    chosen = pairs[rng.integers(0, 6, (n, groups))]  # (rows, groups, 2)
    cols = (np.arange(groups)[None, :, None] * 4 + chosen).reshape(n, -1)
    return _csr(np.repeat(np.arange(n), cols.shape[1]), cols.ravel(), (n, 4 * groups), rng)


def repeatrows(n: int, rng: np.random.Generator, patterns: int = 64, shortest: int = 8, longest: int = 256
               ) -> sp.csr_matrix:
    """Each of n rows a copy of one of ``patterns`` column patterns (log-uniform lengths in [shortest, longest],
    random columns of n): rows of varied lengths that read a few thousand entries of x over and over."""
    lengths = np.exp(rng.uniform(np.log(shortest), np.log(longest), patterns)).astype(np.int64)
    columns = [np.sort(rng.choice(n, size=int(length), replace=False)) for length in lengths]
    which = rng.integers(0, patterns, n)
    rows = np.repeat(np.arange(n), lengths[which])
    return _csr(rows, np.concatenate([columns[w] for w in which]), (n, n), rng)


def webhosts(n: int, rng: np.random.Generator, hosts: int = 20_000, degree: float = 12.0, inside: float = 0.8
             ) -> sp.csr_matrix:
    """A web crawl's link matrix: n pages numbered host by host (hosts of Zipf-like sizes), log-normal out-degrees;
    ``inside`` of a page's links go to pages of its own host near it, the rest to other hosts' home pages (their
    first), chosen in proportion to the hosts' sizes: local runs and a few thousand hub columns."""
    sizes = rng.pareto(1.2, hosts) + 1.0
    bounds = np.concatenate([[0], np.round(np.cumsum(sizes) / sizes.sum() * n).astype(np.int64)])
    bounds = np.maximum.accumulate(np.minimum(bounds, n))
    bounds[-1] = n
    deg = np.maximum(1, np.round(rng.lognormal(np.log(degree) - 0.5, 1.0, n))).astype(np.int64)
    rows = np.repeat(np.arange(n), deg)
    host = np.searchsorted(bounds, rows, side="right") - 1
    lo, hi = bounds[host], np.maximum(bounds[host + 1], bounds[host] + 1)
    near = np.clip(rows + np.round(rng.normal(0.0, 30.0, rows.size)).astype(np.int64), lo, hi - 1)
    weights = np.diff(bounds).astype(np.float64)
    homes = bounds[:-1][rng.choice(hosts, size=rows.size, p=weights / weights.sum())]
    cols = np.where(rng.random(rows.size) < inside, near, np.minimum(homes, n - 1))
    return _csr(rows, cols, (n, n), rng)


def blockangular(blocks: int, rng: np.random.Generator, block_rows: int = 20_000, block_cols: int = 24_000,
                 per_row: int = 8, linking_cols: int = 2_000, linking_rows: int = 400, linking_len: int = 25_000
                 ) -> sp.csr_matrix:
    """A doubly bordered block-angular LP: ``blocks`` diagonal blocks (rows of ``per_row`` random columns of
    their block), 2 entries a row in ``linking_cols`` columns shared by all (right), and ``linking_rows`` rows of
    ``linking_len`` random columns over everything (bottom): short rows, a few long ones, shared columns."""
    m, n = blocks * block_rows, blocks * block_cols + linking_cols
    rows = np.repeat(np.arange(m), per_row)
    cols = (rows // block_rows) * block_cols + rng.integers(0, block_cols, rows.size)
    link = np.repeat(np.arange(m), 2)
    bottom = m + np.repeat(np.arange(linking_rows), linking_len)
    return _csr(np.concatenate([rows, link, bottom]),
                np.concatenate([cols, n - linking_cols + rng.integers(0, linking_cols, link.size),
                                rng.integers(0, n, bottom.size)]), (m + linking_rows, n), rng)


def debruijn(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """A shift graph on n nodes (n rounded down to a multiple of 4): row i links to 4i + c (mod n) and to
    i // 4 + c n / 4, c = 0..3 (a column reached twice counted once)."""
    n -= n % 4
    i = np.arange(n)
    c = np.arange(4)
    out = (4 * i[:, None] + c) % n
    back = i[:, None] // 4 + c * (n // 4)
    return _csr(np.repeat(i, 8), np.hstack([out, back]).ravel(), (n, n), rng)


def blocksparse8(blocks: int, rng: np.random.Generator, per_row: int = 4, size: int = 8) -> sp.csr_matrix:
    """``blocks`` x ``blocks`` blocks of ``size`` x ``size``, each block row holding its diagonal block and
    ``per_row`` dense blocks at uniformly random block columns (one drawn twice counted once)."""
    block_rows = np.repeat(np.arange(blocks), per_row + 1)
    block_cols = np.column_stack([np.arange(blocks), rng.integers(0, blocks, (blocks, per_row))]).ravel()
    inner = np.arange(size)
    rows = (block_rows[:, None, None] * size + inner[None, :, None]).repeat(size, axis=2).ravel()
    cols = (block_cols[:, None, None] * size + inner[None, None, :]).repeat(size, axis=1).ravel()
    return _csr(rows, cols, (blocks * size, blocks * size), rng)


def smallworld(n: int, rng: np.random.Generator, per_scale: int = 2) -> sp.csr_matrix:
    """A ring of n nodes, node i linked to itself and to ``per_scale`` nodes uniformly within 2^l of it
    (wrapped around) at every scale l = 0 .. log2(n) - 1."""
    scales = max(1, int(math.log2(n)))
    reach = np.repeat(2 ** np.arange(scales), per_scale)  # one draw per (scale, link)
    rows = np.repeat(np.arange(n), reach.size)
    step = rng.integers(-np.tile(reach, n), np.tile(reach, n) + 1)
    cols = (rows + step) % n
    diag = np.arange(n)
    return _csr(np.concatenate([rows, diag]), np.concatenate([cols, diag]), (n, n), rng)


def rowperm7(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 7-point Laplacian on a side^3 grid, its rows in random order (the columns as they were)."""
    return _reordered(generate("poisson3d", n=side), rng.permutation(side**3), rng)


def colruns(n: int, rng: np.random.Generator, runs: int = 3, width: int = 48) -> sp.csr_matrix:
    """n x n, each row ``runs`` runs of ``width`` consecutive columns starting at random (overlaps counted
    once)."""
    starts = rng.integers(0, n - width + 1, (n, runs))
    cols = (starts[:, :, None] + np.arange(width)).reshape(n, -1)
    return _csr(np.repeat(np.arange(n), runs * width), cols.ravel(), (n, n), rng)


def staircase(rows: int, rng: np.random.Generator, periods: int = 400, own: int = 6, before: int = 3,
              wider: float = 1.2) -> sp.csr_matrix:
    """A multi-period LP of about ``rows`` rows: ``periods`` periods of log-normal sizes (``wider`` times as many
    columns as rows), each row ``own`` random columns of its period and ``before`` of the period before (the
    first period's rows, of their own only)."""
    sizes = rng.lognormal(0.0, 0.8, periods)
    row_bounds = np.concatenate([[0], np.round(np.cumsum(sizes) / sizes.sum() * rows).astype(np.int64)])
    col_bounds = np.round(row_bounds * wider).astype(np.int64)
    period = np.searchsorted(row_bounds, np.arange(rows), side="right") - 1
    lo, hi = col_bounds[period], np.maximum(col_bounds[period + 1], col_bounds[period] + 1)
    mine = lo[:, None] + (rng.random((rows, own)) * (hi - lo)[:, None]).astype(np.int64)
    prev = np.maximum(period - 1, 0)
    plo, phi = col_bounds[prev], np.maximum(col_bounds[prev + 1], col_bounds[prev] + 1)
    theirs = plo[:, None] + (rng.random((rows, before)) * (phi - plo)[:, None]).astype(np.int64)
    return _csr(np.repeat(np.arange(rows), own + before), np.hstack([mine, theirs]).ravel(),
                (rows, int(col_bounds[-1])), rng)


def lengthsorted(n: int, rng: np.random.Generator, shortest: int = 3, longest: int = 60) -> sp.csr_matrix:
    """n x n, row i a run of log-uniform length (``shortest`` to ``longest``) centred on the diagonal (cut at the
    edges), the rows then sorted by length, longest first, ties in order (as a jagged-diagonal format stores them)."""
    lengths = np.exp(rng.uniform(np.log(shortest), np.log(longest + 1), n)).astype(np.int64)
    start = np.clip(np.arange(n) - lengths // 2, 0, None)
    rows = np.repeat(np.arange(n), lengths)
    A = _csr(rows, np.minimum(_runs(start, lengths), n - 1), (n, n), rng)
    return A[np.argsort(-np.diff(A.indptr), kind="stable")].tocsr()


def twofield(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Two fields on a side^3 grid, coupled node by node ([[L, I], [I, L]], L the 7-point Laplacian): the columns
    field by field, the rows node by node (field 1 then field 2 of each node)."""
    L = generate("poisson3d", n=side)
    N = L.shape[0]
    A = sp.bmat([[L, sp.identity(N)], [sp.identity(N), L]], format="csr")
    return _reordered(A, np.column_stack([np.arange(N), N + np.arange(N)]).ravel(), rng)


def tallshuffled(coarse: int, rng: np.random.Generator, ratio: int = 8) -> sp.csr_matrix:
    """Bilinear interpolation from a coarse x coarse grid to ``ratio`` times as many points (each point at
    random in its coarse cell, 4 entries: the cell's corners), the points in random order: tall, rows far
    apart, each row's columns two pairs a grid line apart."""
    cells = (coarse - 1) ** 2
    cell = rng.permutation(np.repeat(np.arange(cells), ratio))
    base = cell // (coarse - 1) * coarse + cell % (coarse - 1)
    cols = np.column_stack([base, base + 1, base + coarse, base + coarse + 1]).ravel()
    return _csr(np.repeat(np.arange(cell.size), 4), cols, (cell.size, coarse * coarse), rng)


def multicolor(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 27-point stencil on a side^3 grid in 8-colour order (the nodes by the parity of each coordinate, then
    in order; rows and columns alike, as a multicoloured Gauss-Seidel numbers them)."""
    z, y, x = np.unravel_index(np.arange(side**3), (side,) * 3)
    order = np.lexsort((np.arange(side**3), (z % 2) * 4 + (y % 2) * 2 + x % 2))
    return _reordered(_box_stencil(side, 3), order, rng, order)


def blockshuffled(side: int, rng: np.random.Generator, block: int = 512) -> sp.csr_matrix:
    """The 9-point stencil on a side x side grid, its rows (not its columns) in blocks of ``block`` consecutive
    rows, the blocks in random order (as a distributed assembly gathers them)."""
    starts = rng.permutation(np.arange(0, side * side, block))
    order = np.concatenate([np.arange(s, min(s + block, side * side)) for s in starts])
    return _reordered(_box_stencil(side, 2), order, rng)


def rowhash9(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 9-point stencil on a side x side grid, its rows (not its columns) in the order of a multiplicative
    hash of their number (Knuth's, mod 2^32; as a hash-partitioned assembly emits them)."""
    key = (np.arange(side * side, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
    return _reordered(_box_stencil(side, 2), np.argsort(key, kind="stable"), rng)


def groupedrows(rows: int, rng: np.random.Generator, group: int = 32, per_row: int = 24) -> sp.csr_matrix:
    """rows x rows, consecutive groups of ``group`` rows sharing one set of ``per_row`` columns drawn at random
    (one drawn twice counted once): a warp's rows read the same scattered entries of x."""
    patterns = rng.integers(0, rows, (-(-rows // group), per_row))
    return _csr(np.repeat(np.arange(rows), per_row), np.repeat(patterns, group, axis=0)[:rows].ravel(),
                (rows, rows), rng)


def denseblock(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 5-point 2-D Laplacian on a side x side grid with its first 2 side rows and columns a dense block:
    a few thousand rows of 2 side entries, millions of 5."""
    block = 2 * side
    coo = generate("poisson2d", n=side).tocoo()
    outside = (coo.row >= block) | (coo.col >= block)
    dense = np.arange(block * block)
    rows = np.concatenate([coo.row[outside], dense // block])
    return _csr(rows, np.concatenate([coo.col[outside], dense % block]), coo.shape, rng)


def wideclustered(rows: int, rng: np.random.Generator, cols: int = 16_000_000, runs: int = 4,
                  width: int = 100) -> sp.csr_matrix:
    """rows x ``cols`` (very wide: x of 128 MB in float64), each row ``runs`` runs of ``width`` consecutive
    columns at random places."""
    starts = rng.integers(0, cols - width, (rows, runs))
    cols_of = (starts[:, :, None] + np.arange(width)).reshape(rows, -1)
    return _csr(np.repeat(np.arange(rows), runs * width), cols_of.ravel(), (rows, cols), rng)


def hypersparse(n: int, rng: np.random.Generator, filled: float = 0.4, per_row: float = 1.25) -> sp.csr_matrix:
    """n x n with ``filled`` of the rows holding entries (a geometric number, ``per_row`` on average) at random
    columns: most rows empty, x far larger than the entries that read it."""
    rows = np.flatnonzero(rng.random(n) < filled)
    lengths = rng.geometric(1 / per_row, rows.size)
    return _csr(np.repeat(rows, lengths), rng.integers(0, n, int(lengths.sum())), (n, n), rng)


def globalcols(n: int, rng: np.random.Generator, hot: int = 16, half_width: int = 2) -> sp.csr_matrix:
    """n x n, every row reading the same ``hot`` columns (spread over x) and a band of half-width
    ``half_width``: regular rows, a few entries of x read by all."""
    hot_cols = np.sort(rng.choice(n, hot, replace=False))
    band = np.arange(-half_width, half_width + 1)
    cols = np.hstack([np.tile(hot_cols, (n, 1)), np.clip(np.arange(n)[:, None] + band, 0, n - 1)])
    return _csr(np.repeat(np.arange(n), cols.shape[1]), cols.ravel(), (n, n), rng)


def tallwide(rows: int, rng: np.random.Generator, ratio: int = 50, local: int = 10, far: int = 10
             ) -> sp.csr_matrix:
    """rows x ``ratio`` rows (wide), each row ``local`` columns within 1,000 of ``ratio`` times its number and
    ``far`` anywhere: half the gathers stream, half are random reads of an x of hundreds of MB."""
    cols = rows * ratio
    near = np.clip(np.arange(rows)[:, None] * ratio + rng.integers(-1_000, 1_000, (rows, local)), 0, cols - 1)
    anywhere = rng.integers(0, cols, (rows, far))
    return _csr(np.repeat(np.arange(rows), local + far), np.hstack([near, anywhere]).ravel(), (rows, cols), rng)


def zipfrows(n: int, rng: np.random.Generator, exponent: float = 1.0) -> sp.csr_matrix:
    """n x n, the row of rank r (ranks in random order) ``n / r ** exponent`` random columns long (a column drawn
    twice counted once): a Zipf law of row lengths, the longest rows nearly dense, half the rows 1 or 2 long."""
    lengths = np.maximum(1, n / np.arange(1, n + 1, dtype=np.float64) ** exponent).astype(np.int64)
    lengths = lengths[rng.permutation(n)]
    return _csr(np.repeat(np.arange(n), lengths), rng.integers(0, n, int(lengths.sum())), (n, n), rng)


def stencil125(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Each node of a side^3 grid coupled to every node of its 5 x 5 x 5 box (a fourth-order scheme's
    125-point stencil), in order: 125 entries a row in 25 runs of 5."""
    path = sp.diags([1.0] * 5, [-2, -1, 0, 1, 2], shape=(side, side), format="csr")
    A = functools.reduce(lambda a, b: sp.kron(a, b, format="csr"), [path] * 3)
    A.data = _values(rng, A.nnz)
    return A


def vbr3d(side: int, rng: np.random.Generator, dofs: tuple[int, ...] = (1, 3, 6)) -> sp.csr_matrix:
    """The 7-point pattern of a side^3 grid of nodes in order, each node with one of ``dofs`` unknowns at random
    (variable blocks, as a multiphysics mesh has): rows of 7 runs of 1 to 6 columns, their lengths changing
    from node to node."""
    nodes = generate("poisson3d", n=side).tocoo()
    dof = rng.choice(np.asarray(dofs), side**3)
    first = np.concatenate([[0], np.cumsum(dof)])
    count = dof[nodes.row] * dof[nodes.col]  # the entries of each node pair's block
    pair = np.repeat(np.arange(nodes.nnz), count)
    k = np.arange(pair.size) - np.repeat(np.cumsum(count) - count, count)
    width = dof[nodes.col][pair]
    rows = first[nodes.row][pair] + k // width
    return _csr(rows, first[nodes.col][pair] + k % width, (int(first[-1]),) * 2, rng)


def onehot(rows: int, rng: np.random.Generator, ratio: int = 8) -> sp.csr_matrix:
    """rows x rows / ``ratio``, one entry a row at a random column (a sampling or embedding-lookup matrix:
    y = A x gathers x)."""
    cols = max(1, rows // ratio)
    return _csr(np.arange(rows), rng.integers(0, cols, rows), (rows, cols), rng)


def antiband(n: int, rng: np.random.Generator, half_width: int = 4) -> sp.csr_matrix:
    """n x n, row i reading the band i +- ``half_width`` and the anti-diagonal band n - 1 - i +- ``half_width``:
    two streams of x, running in opposite directions."""
    band = np.arange(-half_width, half_width + 1)
    i = np.arange(n)[:, None]
    cols = np.clip(np.hstack([i + band, n - 1 - i + band]), 0, n - 1)
    return _csr(np.repeat(np.arange(n), cols.shape[1]), cols.ravel(), (n, n), rng)


def subsetcols(n: int, rng: np.random.Generator, share: int = 32, per_row: int = 12) -> sp.csr_matrix:
    """n x n, each row ``per_row`` columns drawn from one random subset of n / ``share`` columns (scattered over
    x): random gathers from a working set a thirty-second of x."""
    subset = rng.choice(n, max(1, n // share), replace=False)
    return _csr(np.repeat(np.arange(n), per_row), subset[rng.integers(0, subset.size, n * per_row)], (n, n), rng)


def fewlongrows(rows: int, rng: np.random.Generator, cols: int = 30_000_000, length: int = 250_000
                ) -> sp.csr_matrix:
    """``rows`` rows of ``length`` random columns of ``cols`` (a column drawn twice counted once): very few, very
    long rows of a very wide matrix, the work in the entries and not the rows."""
    return _csr(np.repeat(np.arange(rows), length), rng.integers(0, cols, rows * length), (rows, cols), rng)


def degreesorted(n: int, rng: np.random.Generator, shape: float = 1.5, minimum: int = 4) -> sp.csr_matrix:
    """A Chung-Lu power-law graph (Pareto degrees, each edge's far end drawn in proportion to degree) with its
    vertices numbered by falling degree, rows and columns alike (as graph frameworks number them): the longest
    rows first, the most read columns first."""
    degree = np.minimum(np.floor(minimum * (1.0 + rng.pareto(shape, n))), n // 16).astype(np.int64)
    far = np.searchsorted(np.cumsum(degree), rng.random(int(degree.sum())) * degree.sum(), side="right")
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(-degree, kind="stable")] = np.arange(n)
    return _csr(rank[np.repeat(np.arange(n), degree)], rank[np.minimum(far, n - 1)], (n, n), rng)


def _nested_dissection(side: int, leaf: int = 32) -> np.ndarray:
    """The nodes of a side x side grid (row-major numbers) in nested-dissection order: a box's two halves, each
    ordered so, then the line between them; boxes of at most ``leaf`` x ``leaf`` row by row."""
    grid = np.arange(side * side).reshape(side, side)
    out: list[np.ndarray] = []

    def order(r0: int, r1: int, c0: int, c1: int) -> None:
        if r1 <= r0 or c1 <= c0:
            return
        if r1 - r0 <= leaf and c1 - c0 <= leaf:
            out.append(grid[r0:r1, c0:c1].ravel())
        elif r1 - r0 >= c1 - c0:
            m = (r0 + r1) // 2
            order(r0, m, c0, c1)
            order(m + 1, r1, c0, c1)
            out.append(grid[m, c0:c1])
        else:
            m = (c0 + c1) // 2
            order(r0, r1, c0, m)
            order(r0, r1, m + 1, c1)
            out.append(grid[r0:r1, m])

    order(0, side, 0, side)
    return np.concatenate(out)


def ndgrid(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 9-point stencil of a side x side grid in nested-dissection order (rows and columns; as a sparse direct
    solver orders it): boxes local, each separator's rows reading the two boxes it parts, far apart."""
    p = _nested_dissection(side)
    return _reordered(_box_stencil(side, 2), p, rng, p)


def diagonal(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """An n x n diagonal matrix (a scaling): one entry a row, x and y streamed."""
    return _csr(np.arange(n), np.arange(n), (n, n), rng)


def bitrev5(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 5-point stencil of a side x side grid with rows and columns in the order of their numbers' bits
    reversed (an FFT's permutation): neighbouring rows half the matrix apart, rows 2^k apart near."""
    n = side * side
    bits = max(1, (n - 1).bit_length())
    i = np.arange(n, dtype=np.int64)
    key = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        key |= ((i >> b) & 1) << (bits - 1 - b)
    p = np.argsort(key, kind="stable")
    return _reordered(generate("poisson2d", n=side), p, rng, p)


def log2rows(n: int, rng: np.random.Generator, longest: int = 10) -> sp.csr_matrix:
    """n x n, row i a run of 2^k consecutive columns around column i, k uniform in 0..``longest``: rows of every
    length from 1 to 1,024 side by side, each reading x in one stream."""
    lengths = np.minimum(1 << rng.integers(0, longest + 1, n), n).astype(np.int64)
    starts = np.clip(np.arange(n) - lengths // 2, 0, n - lengths)
    return _csr(np.repeat(np.arange(n), lengths), _runs(starts, lengths), (n, n), rng)


def onedenserow(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 5-point stencil of a side x side grid in order with its middle row reading every column (a global
    constraint, or one node tied to all the others): one row holding a sixth of the entries amid rows of 5."""
    grid = generate("poisson2d", n=side).tocoo()
    n = side * side
    return _csr(np.concatenate([grid.row, np.full(n, n // 2)]), np.concatenate([grid.col, np.arange(n)]), (n, n),
                rng)


def topheavy(n: int, rng: np.random.Generator, share: int = 50, shortest: int = 100, longest: int = 300,
             window: int = 2_000) -> sp.csr_matrix:
    """n x n, only the first n / ``share`` rows filled, row i ``shortest`` to ``longest`` random columns within
    ``window`` of ``share`` * i (a column drawn twice counted once): all the work in the first rows, the rest of
    the matrix empty (as a problem padded to a larger size stores it)."""
    lengths = rng.integers(shortest, longest + 1, n // share)
    rows = np.repeat(np.arange(lengths.size), lengths)
    return _csr(rows, np.minimum(rows * share + rng.integers(0, window, rows.size), n - 1), (n, n), rng)


def lattice4d(side: int, rng: np.random.Generator, unknowns: int = 12) -> sp.csr_matrix:
    """A periodic 4-D lattice of side^4 sites in order, ``unknowns`` a site (3 colours x 4 spins), each site
    coupled to itself and its 8 neighbours by dense blocks (a lattice QCD Wilson-Dirac pattern): 108 entries a
    row in 9 runs of 12, the neighbours across each wrap-around at the dimension's far end."""
    ring = sp.diags([1.0] * 4, [-1, 1, side - 1, 1 - side], shape=(side, side), format="csr")
    eye = sp.identity(side, format="csr")
    sites = sp.identity(side**4, format="csr")
    for d in range(4):
        sites = sites + functools.reduce(lambda a, b: sp.kron(a, b, format="csr"),
                                         [ring if k == d else eye for k in range(4)])
    A = sp.kron(sites, sp.csr_matrix(np.ones((unknowns, unknowns))), format="csr")
    A.data = _values(rng, A.nnz)
    return A


def _zipf_ranks(count: int, size: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` ranks in [0, ``size``) drawn from the discrete Zipf law of ``exponent`` (rank r with weight
    1 / (r + 1) ** exponent; any exponent, 1 included), by a search of its cumulative weights."""
    cdf = np.cumsum(1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent)
    return np.minimum(np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right"), size - 1)


def termdoc(docs: int, rng: np.random.Generator, ratio: int = 8, median: float = 20.0, sigma: float = 1.0,
            zipf: float = 1.05) -> sp.csr_matrix:
    """A term-document matrix: ``docs`` rows x ``ratio`` times as many terms, log-normal document lengths
    (median 20), each term drawn from a Zipf law and numbered by frequency as a vocabulary is (a term drawn twice
    in a document counted once): wide, x far beyond the L2, most reads in its first columns."""
    terms = ratio * docs
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(median), sigma, docs))).astype(np.int64)
    cols = _zipf_ranks(int(lengths.sum()), terms, zipf, rng)
    return _csr(np.repeat(np.arange(docs), lengths), cols, (docs, terms), rng)


def everyother(n: int, rng: np.random.Generator, width: int = 40) -> sp.csr_matrix:
    """n x n, the even rows empty and each odd row a run of ``width`` columns around its diagonal: half the rows
    empty in a regular pattern (one field of an interleaved pair, the other left out)."""
    filled = np.arange(1, n, 2)
    starts = np.clip(filled - width // 2, 0, n - width)
    return _csr(np.repeat(filled, width), (starts[:, None] + np.arange(width)).ravel(), (n, n), rng)


def cliques(n: int, rng: np.random.Generator, size: int = 30, per_vertex: int = 2) -> sp.csr_matrix:
    """The clique expansion of a random hypergraph: n vertices, each dealt at random into ``per_vertex``
    hyperedges of ``size``, each row the members of its hyperedges: about 60 entries a row at random columns,
    each set of 30 columns read by 30 rows far apart."""
    edges = n * per_vertex // size
    members = np.concatenate([rng.permutation(n) for _ in range(per_vertex)])[: edges * size].reshape(edges, size)
    return _csr(np.repeat(members, size, axis=1).ravel(), np.tile(members, (1, size)).ravel(), (n, n), rng)


def blocktri(blocks: int, rng: np.random.Generator, size: int = 48) -> sp.csr_matrix:
    """Block tridiagonal, ``blocks`` dense ``size`` x ``size`` blocks a side (a 1-D chain of elements of many
    unknowns each): every row one run of 3 x ``size`` columns (2 x ``size`` in the first and last blocks)."""
    n = blocks * size
    block = np.arange(n) // size
    starts = np.maximum(block - 1, 0) * size
    lengths = np.minimum(block + 2, blocks) * size - starts
    return _csr(np.repeat(np.arange(n), lengths), _runs(starts, lengths), (n, n), rng)


def randperm(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """An n x n random permutation matrix: one entry a row and a column, each row's anywhere (x of 192 MB in
    float64 at 24 M rows: every gather a random read of DRAM)."""
    return _csr(np.arange(n), rng.permutation(n), (n, n), rng)


def window(n: int, rng: np.random.Generator, per_row: int = 30, width: int = 4_096) -> sp.csr_matrix:
    """n x n, each row ``per_row`` random columns within a window of ``width`` at a random place (a column drawn
    twice counted once): every row narrow (its columns fit 16-bit offsets), neighbouring rows far apart."""
    starts = rng.integers(0, n - width + 1, n)
    rows = np.repeat(np.arange(n), per_row)
    return _csr(rows, starts[rows] + rng.integers(0, width, rows.size), (n, n), rng)


def useritem(users: int, rng: np.random.Generator, ratio: int = 4, shape: float = 1.5, minimum: int = 3,
             zipf: float = 1.0) -> sp.csr_matrix:
    """A recommender's user x item matrix: ``users`` rows of Pareto degrees (at least ``minimum``) over
    users / ``ratio`` items drawn from a Zipf law and numbered at random (a pair drawn twice counted once):
    power-law rows and power-law columns, the popular columns scattered over x."""
    items = max(1, users // ratio)
    degree = np.minimum(np.floor(minimum * (1.0 + rng.pareto(shape, users))), items).astype(np.int64)
    ranks = _zipf_ranks(int(degree.sum()), items, zipf, rng)
    return _csr(np.repeat(np.arange(users), degree), rng.permutation(items)[ranks], (users, items), rng)


def upper27(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The upper triangle (the diagonal in) of the 27-point stencil of a side^3 grid in order, as symmetric
    storage keeps it: 14 entries a row inside, in 5 runs, every column at or right of the diagonal."""
    A = sp.triu(_box_stencil(side, 3), format="csr")
    A.data = _values(rng, A.nnz)
    return A


def widestencil(side: int, rng: np.random.Generator, radius: int = 4) -> sp.csr_matrix:
    """Each node of a side^3 grid in order coupled to every node of its 9^3 box (a wide-support kernel, or the
    pattern of high-order elements): 729 entries a row inside, in 81 runs of 9."""
    A = _box_stencil(side, 3, radius)
    A.data = _values(rng, A.nnz)
    return A


def _morton(side: int, dims: int) -> np.ndarray:
    """The nodes of a side^dims grid (numbered in order, the last coordinate fastest) in Z order: by the bits of
    their coordinates interleaved."""
    coords = np.indices((side,) * dims).reshape(dims, -1)
    key = np.zeros(coords.shape[1], dtype=np.int64)
    for bit in range(int(side - 1).bit_length()):
        for d in range(dims):
            key |= ((coords[d] >> bit) & 1) << (bit * dims + (dims - 1 - d))
    return np.argsort(key, kind="stable")


def morton27(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 27-point stencil on a side^3 grid in Z (Morton) order, rows and columns (as octree and particle codes
    number cells): neighbours mostly near, a jump at every power-of-two boundary."""
    order = _morton(side, 3)
    return _reordered(_box_stencil(side, 3), order, rng, order)


def colperm27(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 27-point stencil on a side^3 grid, rows in order and the columns alone under a random permutation
    (unknowns numbered apart from the equations): 27 random columns a row, neighbouring rows sharing 18."""
    return _columns_permuted_of(_box_stencil(side, 3), rng)


def _columns_permuted_of(A: sp.spmatrix, rng: np.random.Generator) -> sp.csr_matrix:
    """``A`` with its columns alone under a random permutation (rows kept), values drawn from ``rng``."""
    return _reordered(A, np.arange(A.shape[0]), rng, rng.permutation(A.shape[1]))


def invertedindex(docs: int, rng: np.random.Generator, ratio: int = 4, median: float = 12.0) -> sp.csr_matrix:
    """The transpose of :func:`termdoc` (an inverted index: a row a term, its documents in order): terms
    numbered by frequency, the first rows holding up to a document each, most rows empty or of one entry."""
    return termdoc(docs, rng, ratio=ratio, median=median).T.tocsr()


def cutoff3d(n: int, rng: np.random.Generator, degree: float = 300.0) -> sp.csr_matrix:
    """n points in the unit cube, each coupled to every point within the radius holding ``degree`` of them on
    average (a molecular-dynamics or overlap matrix), points numbered by cell of that radius: long rows of
    nearby columns in a few dozen short runs."""
    from scipy.spatial import cKDTree

    r = (3.0 * degree / (4.0 * math.pi * n)) ** (1.0 / 3.0)
    pts = rng.random((n, 3))
    cell = np.floor(pts / r).astype(np.int64)
    pts = pts[np.lexsort((cell[:, 0], cell[:, 1], cell[:, 2]))]
    pairs = cKDTree(pts).query_pairs(r, output_type="ndarray")
    i, j, diag = pairs[:, 0], pairs[:, 1], np.arange(n)
    return _csr(np.concatenate([i, j, diag]), np.concatenate([j, i, diag]), (n, n), rng)


def groupby(groups: int, rng: np.random.Generator, median: float = 40.0, sigma: float = 1.0) -> sp.csr_matrix:
    """A group-by sum: ``groups`` rows over records sorted by group, log-normal group sizes (median 40): each row
    one run of its records, each column read once (x streamed, far beyond the L2)."""
    sizes = np.maximum(1, np.round(rng.lognormal(np.log(median), sigma, groups))).astype(np.int64)
    return _csr(np.repeat(np.arange(groups), sizes), np.arange(int(sizes.sum())), (groups, int(sizes.sum())), rng)


def prunedlayer(n: int, rng: np.random.Generator, density: float = 0.1) -> sp.csr_matrix:
    """An n x n weight matrix pruned at random to ``density`` (a neural network layer's unstructured sparsity):
    rows of about density n random columns, all of them in an x of n entries (128 KB in float64 at n = 16,384)."""
    rows = np.repeat(np.arange(n), rng.binomial(n, density, n))
    return _csr(rows, rng.integers(0, n, rows.size), (n, n), rng)


_TWO_OF_FOUR = np.array([(a, b) for a in range(4) for b in range(a + 1, 4)], dtype=np.int32)
"""The six ways to keep 2 of 4 neighbouring columns."""


def twofour(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """An n x n weight matrix in 2:4 structured sparsity (2 of every 4 neighbouring columns of a row kept, the
    pattern sparse tensor cores take): every row n / 2 entries over its whole width, in pairs a quad."""
    quads = n // 4
    kept = _TWO_OF_FOUR[rng.integers(0, len(_TWO_OF_FOUR), (n, quads))] + 4 * np.arange(quads, dtype=np.int32)[:, None]
    indptr = np.arange(n + 1, dtype=np.int64) * 2 * quads
    return sp.csr_matrix((_values(rng, 2 * n * quads), kept.reshape(-1), indptr), shape=(n, n))


def spectralz(side: int, rng: np.random.Generator, depth: int = 64) -> sp.csr_matrix:
    """A side x side x ``depth`` grid, z fastest, with finite differences in x and y (the 4 neighbours) and a
    spectral method along z (every point of a node's z line): 68 entries a row, a run of 64 and 4 far singles."""
    path = sp.diags([1.0, 1.0], [-1, 1], shape=(side, side), format="csr")
    plane = sp.kron(path, sp.identity(side), format="csr") + sp.kron(sp.identity(side), path, format="csr")
    A = (sp.kron(plane, sp.identity(depth), format="csr")
         + sp.kron(sp.identity(side * side), sp.csr_matrix(np.ones((depth, depth))), format="csr")).tocsr()
    A.data = _values(rng, A.nnz)
    return A


def erdos(n: int, rng: np.random.Generator, degree: int = 250) -> sp.csr_matrix:
    """A dense-ish Erdos-Renyi graph: ``degree`` uniformly random columns a row (a column drawn twice counted once)
    (at scale 1, of an x of 800 KB in float64): long rows, every gather random but within the L2."""
    rows = np.repeat(np.arange(n), degree)
    return _csr(rows, rng.integers(0, n, rows.size), (n, n), rng)


def wideband(n: int, rng: np.random.Generator, half_width: int = 400) -> sp.csr_matrix:
    """A band of half-width ``half_width`` with every entry stored (an integral operator's near field): each row one
    run of up to 801 columns around its diagonal, x of 240 KB (float64)."""
    rows = np.arange(n)
    starts, ends = np.maximum(rows - half_width, 0), np.minimum(rows + half_width + 1, n)
    indptr = np.concatenate([[0], np.cumsum(ends - starts)])
    return sp.csr_matrix((_values(rng, int(indptr[-1])), _runs(starts, ends - starts), indptr), shape=(n, n))


def randblocks(blocks: int, rng: np.random.Generator, smallest: int = 4, largest: int = 64, per_row: int = 6
               ) -> sp.csr_matrix:
    """Dense blocks of variable sizes at random places: ``blocks`` block rows of 4 to 64 rows (log-uniform), each
    coupled to its diagonal block and ``per_row`` others at random (a graph of multi-unknown nodes numbered at
    random): each row a few runs of 4 to 64 columns far apart."""
    sizes = np.exp(rng.uniform(np.log(smallest), np.log(largest + 1), blocks)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    partners = np.column_stack([np.arange(blocks), rng.integers(0, blocks, (blocks, per_row))])
    partners.sort(axis=1)
    block_of_row = np.repeat(np.arange(blocks), sizes)
    mine = partners[block_of_row]  # each row's block columns, its block row's
    lengths = sizes[mine].reshape(-1)
    cols = _runs(starts[mine].reshape(-1), lengths)
    rows = np.repeat(np.repeat(np.arange(block_of_row.size), mine.shape[1]), lengths)
    n = int(sizes.sum())
    return _csr(rows, cols, (n, n), rng)


def hmatrix(n: int, rng: np.random.Generator, near: int = 32, first: int = 5) -> sp.csr_matrix:
    """A hierarchical (H-matrix or fast-multipole) pattern: each row a run of ``near`` columns about its diagonal
    (the near field) and one column at each distance 2^k, k >= ``first``, on either side (one far-field entry a
    level): about 32 + 2 log2(n / 32) entries a row, one run and singles ever further apart."""
    rows = np.arange(n)
    starts = np.clip(rows - near // 2, 0, max(n - near, 0))
    lengths = np.full(n, min(near, n))
    offsets = 2 ** np.arange(first, max(first, int(np.log2(max(n, 2)))) + 1)
    far = rows[:, None] + np.concatenate([-offsets, offsets])[None, :]
    kept = (far >= 0) & (far < n)
    cols = np.concatenate([_runs(starts, lengths), far[kept]])
    return _csr(np.concatenate([np.repeat(rows, lengths), np.broadcast_to(rows[:, None], far.shape)[kept]]), cols,
                (n, n), rng)


def circuit(n: int, rng: np.random.Generator, nets: int = 20, local: int = 4, width: int = 1_000) -> sp.csr_matrix:
    """A circuit's modified nodal analysis pattern: each node its diagonal and ``local`` random nodes within
    ``width`` (devices wired nearby), and each attached to one of ``nets`` supply nets numbered at random places,
    whose rows and columns hold every node on them (about n / nets entries each): short rows, a few dense rows and
    dense columns scattered through the matrix."""
    rows = np.arange(n)
    near = np.clip(rows[:, None] + rng.integers(-width, width + 1, (n, local)), 0, n - 1)
    supply = rng.choice(n, nets, replace=False)[rng.integers(0, nets, n)]
    r = np.concatenate([rows, np.repeat(rows, local), rows, supply])
    c = np.concatenate([rows, near.reshape(-1), supply, rows])
    return _csr(r, c, (n, n), rng)


def tridiag(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """A tridiagonal matrix (a 1-D operator, an implicit time step, a line of a line solver): three entries a row,
    x read once in order, the shortest rows a PDE gives."""
    rows = np.arange(n)
    starts = np.maximum(rows - 1, 0)
    lengths = np.minimum(rows + 2, n) - starts
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return sp.csr_matrix((_values(rng, int(indptr[-1])), _runs(starts, lengths), indptr), shape=(n, n))


def dgblocks(side: int, rng: np.random.Generator, order: int = 3) -> sp.csr_matrix:
    """A discontinuous Galerkin operator on a side^3 grid of hexahedra of ``order`` (64 unknowns an element at 3,
    numbered x fastest): each row its element's whole dense block and, for each of the 6 face neighbours, that
    neighbour's unknowns on the shared face (a run of 16 across z, 4 runs of 4 across y, 16 singles 4 apart across
    x): about 160 entries a row in up to 27 runs."""
    k = order + 1
    per = k**3
    local = np.arange(per)
    e = np.arange(side**3)
    r, c = [], []

    def couple(elements: np.ndarray, targets: np.ndarray, unknowns: np.ndarray) -> None:
        """Every unknown of each of ``elements`` to ``unknowns`` of its element of ``targets``."""
        r.append(np.repeat((elements[:, None] * per + local).reshape(-1), unknowns.size))
        c.append(np.repeat(targets[:, None] * per + unknowns, per, axis=0).reshape(-1))

    couple(e, e, local)
    for axis in range(3):
        at = e // side**axis % side
        on = local // k**axis % k
        for step, shared in ((1, 0), (-1, k - 1)):  # the neighbour above shares its low face, below its high one
            inside = (at + step >= 0) & (at + step < side)
            couple(e[inside], e[inside] + step * side**axis, local[on == shared])
    return _csr(np.concatenate(r), np.concatenate(c), (side**3 * per, side**3 * per), rng)


def transposed5(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """A 2-D 5-point stencil whose rows are numbered by grid row and its columns by grid column (an ADI sweep or
    an FFT's transpose fused into the operator): each row a run of 3 and 2 singles side apart, and neighbouring rows
    side columns apart (x gathered at a stride, not in order)."""
    A = _box_stencil(side, 2).tocoo()  # 9-point box; keep its 5-point cross
    cross = (np.abs(A.row - A.col) <= 1) | (np.abs(A.row - A.col) == side)
    cross &= ~((np.abs(A.row - A.col) == 1) & (A.row // side != A.col // side))
    col = A.col[cross]
    return _csr(A.row[cross], (col % side) * side + col // side, (side * side, side * side), rng)


def bigbird(n: int, rng: np.random.Generator, window: int = 64, hubs: int = 8, random: int = 48) -> sp.csr_matrix:
    """A sparse attention mask (BigBird): each token a window of ``window`` about itself, the first ``hubs``
    (global) tokens and ``random`` tokens at random; the global tokens' rows whole: a band, dense first columns,
    a few full rows, random gathers."""
    rows = np.arange(n)
    starts = np.clip(rows - window // 2, 0, max(n - window, 0))
    lengths = np.full(n, min(window, n))
    r = np.concatenate([np.repeat(rows, lengths), np.repeat(rows, hubs), np.repeat(rows, random),
                        np.repeat(np.arange(hubs), n)])
    c = np.concatenate([_runs(starts, lengths), np.tile(np.arange(hubs), n), rng.integers(0, n, n * random),
                        np.tile(rows, hubs)])
    return _csr(r, c, (n, n), rng)


def spinchain(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The Heisenberg spin chain's Hamiltonian (exact diagonalization): basis states 0 .. n-1 of L = ceil(log2 n)
    spins in a ring, each row its diagonal and the states with one antiparallel neighbouring pair swapped (column
    i ^ (2^k + 2^(k+1 mod L)), kept where below n): L/2 + 1 entries a row on average (binomial), at offsets of every
    power of two, the same for runs of consecutive rows."""
    spins = max(2, int(n - 1).bit_length())
    i = np.arange(n, dtype=np.int64)
    rows, cols = [i], [i]
    for k in range(spins):
        mask = (1 << k) | (1 << ((k + 1) % spins))
        flips = ((i >> k) & 1) != ((i >> ((k + 1) % spins)) & 1)
        j = i[flips] ^ mask
        keep = j < n
        rows.append(i[flips][keep])
        cols.append(j[keep])
    return _csr(np.concatenate(rows), np.concatenate(cols), (n, n), rng)


def dilated(side: int, rng: np.random.Generator, dilations: tuple[int, ...] = (1, 4, 16)) -> sp.csr_matrix:
    """A dilated convolution on a side x side image (atrous 3 x 3 kernels at each of ``dilations``, their centre
    shared): 25 entries a row inside, in 9 runs of one to three columns on 7 image rows as far as 16 rows apart."""
    r, c = np.divmod(np.arange(side * side, dtype=np.int64), side)
    steps = {(dy * d, dx * d) for d in dilations for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    rows, cols = [], []
    for dy, dx in sorted(steps):
        y, x = r + dy, c + dx
        inside = (y >= 0) & (y < side) & (x >= 0) & (x < side)
        rows.append(r[inside] * side + c[inside])
        cols.append(y[inside] * side + x[inside])
    return _csr(np.concatenate(rows), np.concatenate(cols), (side * side, side * side), rng)


def sellslices(rows: int, rng: np.random.Generator, slice_rows: int = 32, longest: int = 512,
               ratio: int = 10) -> sp.csr_matrix:
    """rows x (ratio * rows): every slice of ``slice_rows`` consecutive rows of one length, log-uniform from 1 to
    ``longest`` across slices, columns uniformly random: rows even within a warp, uneven from one warp to the
    next, gathers from an x ten times as long."""
    slices = -(-rows // slice_rows)
    lengths = np.repeat(np.exp(rng.uniform(0, math.log(longest), slices)).astype(np.int64), slice_rows)[:rows]
    r = np.repeat(np.arange(rows), lengths)
    return _csr(r, rng.integers(0, ratio * rows, r.size), (rows, ratio * rows), rng)


def interleaved(n: int, rng: np.random.Generator, half_width: int = 4, far: int = 40) -> sp.csr_matrix:
    """Rows that alternate: an even row a run of 2 * half_width + 1 columns about its diagonal, an odd one ``far``
    random columns; every warp reads both, one contiguous and one scattered half."""
    i = np.arange(n, dtype=np.int64)
    even, odd = i[::2], i[1::2]
    near = (even[:, None] + np.arange(-half_width, half_width + 1)[None, :]).ravel()
    rows = np.concatenate([np.repeat(even, 2 * half_width + 1), np.repeat(odd, far)])
    cols = np.concatenate([near, rng.integers(0, n, odd.size * far)])
    keep = (cols >= 0) & (cols < n)
    return _csr(rows[keep], cols[keep], (n, n), rng)


def citations(n: int, rng: np.random.Generator, per_row: int = 20, recent: int = 2_000) -> sp.csr_matrix:
    """A citation graph in order of publication (strictly lower triangular): paper i cites ``per_row`` earlier ones,
    half among the ``recent`` papers before it, half by popularity (column i * u^3 for u uniform: the oldest
    papers cited most); the first papers cite fewer (one drawn twice counted once)."""
    i = np.repeat(np.arange(1, n, dtype=np.int64), per_row)
    u = rng.random(i.size)
    half = np.arange(i.size) % per_row < per_row // 2
    cols = np.where(half, i - 1 - np.floor(u * np.minimum(i, recent)).astype(np.int64),
                    np.floor(i * u ** 3).astype(np.int64))
    return _csr(i, np.minimum(cols, i - 1), (n, n), rng)


def torus3d(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The 7-point Laplacian on a side^3 grid with periodic boundaries: every row 7 entries, a face's rows also
    the far face's (columns side - 1 planes, rows or places away): 2 / side of the rows span the whole of x."""
    me = np.arange(side ** 3, dtype=np.int64)
    z, rest = np.divmod(me, side * side)
    y, x = np.divmod(rest, side)
    rows, cols = [me], [me]
    for dz, dy, dx in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)):
        rows.append(me)
        cols.append((((z + dz) % side) * side + (y + dy) % side) * side + (x + dx) % side)
    return _csr(np.concatenate(rows), np.concatenate(cols), (side ** 3, side ** 3), rng)


def reactdiff(side: int, rng: np.random.Generator, species: int = 20) -> sp.csr_matrix:
    """A reaction-diffusion Jacobian on a side x side grid, ``species`` unknowns a node numbered node by node: each
    row the node's whole reaction block (a run of ``species``) and its species at the 4 neighbours (singles
    ``species`` and ``side * species`` columns away)."""
    node = np.arange(side * side, dtype=np.int64)
    y, x = np.divmod(node, side)
    rows = [np.repeat(np.arange(side * side * species, dtype=np.int64), species)]
    cols = [np.repeat(node * species, species * species) + np.tile(np.arange(species), side * side * species)]
    s = np.arange(species)
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        inside = (y + dy >= 0) & (y + dy < side) & (x + dx >= 0) & (x + dx < side)
        here, there = node[inside], node[inside] + dy * side + dx
        rows.append((here[:, None] * species + s).ravel())
        cols.append((there[:, None] * species + s).ravel())
    n = side * side * species
    return _csr(np.concatenate(rows), np.concatenate(cols), (n, n), rng)


def patree(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The Laplacian pattern of a random tree grown node by node, node i hanging from node floor(i u^2) (u uniform:
    the old nodes collect children, degrees a power law as under preferential attachment), in order of arrival:
    3 entries a row on average, the first rows thousands long, a child's row reading its parent far back."""
    child = np.arange(1, n, dtype=np.int64)
    parent = np.floor(child * rng.random(child.size) ** 2).astype(np.int64)
    diagonal = np.arange(n, dtype=np.int64)
    return _csr(np.concatenate([diagonal, child, parent]), np.concatenate([diagonal, parent, child]), (n, n), rng)


def kronrandom(n: int, rng: np.random.Generator, per_row: int = 5) -> sp.csr_matrix:
    """The Kronecker product of two random n x n matrices of ``per_row`` random columns a row: n^2 rows of up to
    per_row^2 entries in per_row clusters (one a column of the first factor), each per_row random columns of a
    window of n, the windows far apart."""
    def factor() -> sp.csr_matrix:
        r = np.repeat(np.arange(n), per_row)
        return _csr(r, rng.integers(0, n, r.size), (n, n), rng)

    K = sp.kron(factor(), factor(), format="coo")
    return _csr(K.row, K.col, K.shape, rng)


def sparseblocks(blocks: int, rng: np.random.Generator, size: int = 64, density: float = 0.2) -> sp.csr_matrix:
    """Block diagonal, ``blocks`` independent sparse blocks of size x size each entry present with probability
    ``density`` (a chemistry Jacobian per cell, a batch of small systems): about 13 random columns a row, all
    within the row's own 64."""
    r = np.repeat(np.arange(blocks * size, dtype=np.int64), size)
    c = (r // size) * size + np.tile(np.arange(size), blocks * size)
    keep = rng.random(r.size) < density
    keep |= r == c  # the diagonal always
    return _csr(r[keep], c[keep], (blocks * size, blocks * size), rng)


def tandemqueue(capacity: int, rng: np.random.Generator, queues: int = 5) -> sp.csr_matrix:
    """The generator of a continuous-time Markov chain, ``queues`` queues in tandem of ``capacity`` each (states
    numbered with the first queue's length fastest): each row its diagonal, an arrival, a move from each queue to
    the next and a departure where the state allows: up to queues + 2 entries at offsets +1, (c+1)^(k+1) - (c+1)^k
    and -(c+1)^(queues-1), fewer at the boundaries."""
    base = capacity + 1
    state = np.arange(base ** queues, dtype=np.int64)
    length = [state // base ** k % base for k in range(queues)]
    rows, cols = [state], [state]
    moves = [(length[0] < capacity, 1)]  # an arrival
    moves += [((length[k] > 0) & (length[k + 1] < capacity), base ** (k + 1) - base ** k) for k in range(queues - 1)]
    moves += [(length[-1] > 0, -base ** (queues - 1))]  # a departure
    for allowed, step in moves:
        rows.append(state[allowed])
        cols.append(state[allowed] + step)
    return _csr(np.concatenate(rows), np.concatenate(cols), (state.size, state.size), rng)


def levy(n: int, rng: np.random.Generator, per_row: int = 16, tail: float = 0.5) -> sp.csr_matrix:
    """Jumps of a Levy flight on a ring: row i reads ``per_row`` columns i +- d, d heavy-tailed (1 + Lomax(``tail``),
    half of the draws within 4, 3 % beyond 1,000, 0.3 % beyond 100,000): most gathers near the diagonal, a few
    anywhere."""
    i = np.repeat(np.arange(n, dtype=np.int64), per_row)
    d = np.fmod(np.floor(1 + rng.pareto(tail, i.size)), n).astype(np.int64)  # a draw past 2^63 wraps, not overflows
    return _csr(i, (i + np.where(rng.random(i.size) < 0.5, d, -d)) % n, (n, n), rng)


def matricized(rows: int, rng: np.random.Generator, slices: int = 2_000, fibre: int = 10_000, per_row: int = 4,
               per_slice: int = 6, zipf: float = 1.1) -> sp.csr_matrix:
    """A sparse 3-way tensor unfolded along its first mode (rows x slices * fibre, the matricization a tensor
    decomposition's MTTKRP multiplies): each row ``per_row`` slices j (Zipf over ``slices``: a few slices hot) and
    ``per_slice`` random k in each, at column j * fibre + k: x of 20 M (160 MB in float64), gathers in clusters of
    6 within windows of 10,000."""
    j = rng.permutation(slices)[_zipf_ranks(rows * per_row, slices, zipf, rng)]  # the hot slices anywhere
    cols = (np.repeat(j, per_slice) * fibre + rng.integers(0, fibre, j.size * per_slice))
    return _csr(np.repeat(np.arange(rows), per_row * per_slice), cols, (rows, slices * fibre), rng)


def maxwell(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The curl-curl operator plus identity on a periodic side^3 Yee grid (Maxwell's equations, edge unknowns),
    numbered field by field (every x-edge, then every y-edge, then every z-edge): 13 entries a row, 5 in the row's
    own third of x (itself and its neighbours across the other two axes) and 4 in each of the other two thirds."""
    D = sp.diags([-1.0, 1.0, 1.0], [0, 1, 1 - side], shape=(side, side), format="csr")  # periodic forward difference
    eye = sp.identity(side, format="csr")
    Dx, Dy, Dz = (sp.kron(sp.kron(a, b), c, format="csr") for a, b, c in ((eye, eye, D), (eye, D, eye), (D, eye, eye)))
    zero = sp.csr_matrix(Dx.shape)
    C = sp.bmat([[zero, -Dz, Dy], [Dz, zero, -Dx], [-Dy, Dx, zero]], format="csr")
    A = (C.T @ C + sp.identity(C.shape[0])).tocsr()
    A.eliminate_zeros()
    A.data = _values(rng, A.nnz)
    return A


def haar(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The Haar wavelet synthesis of a signal of ``n`` samples (n x about 2n, the coefficients level by level): row i
    one column in each level's section, at i >> k: ceil(log2 n) + 1 entries a row, each in a section of its own,
    and rows 2^k apart share the level-k column (the coarsest sections read by every row)."""
    levels = max(1, int(n - 1).bit_length()) + 1
    lengths = [-(-n // 2**k) for k in range(levels)]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    i = np.arange(n, dtype=np.int64)
    cols = (offsets[None, :] + (i[:, None] >> np.arange(levels)[None, :])).reshape(-1)
    return _csr(np.repeat(i, levels), cols, (n, int(sum(lengths))), rng)


def conv3dch(side: int, rng: np.random.Generator, channels: int = 16) -> sp.csr_matrix:
    """A 3 x 3 x 3 convolution of a side^3 volume of ``channels`` channels (zero padding), numbered voxel by voxel,
    channels fastest: each output (voxel, channel) reads every input channel of its 27 neighbours, 27 runs of 16
    columns (432 entries a row inside), x of 54,000 at scale 1."""
    z, rest = np.divmod(np.arange(side**3, dtype=np.int64), side * side)
    y, x = np.divmod(rest, side)
    voxel_rows, voxel_cols = [], []
    for dz in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                inside = ((z + dz >= 0) & (z + dz < side) & (y + dy >= 0) & (y + dy < side) & (x + dx >= 0)
                          & (x + dx < side))
                voxel_rows.append(np.flatnonzero(inside))
                voxel_cols.append(np.flatnonzero(inside) + (dz * side + dy) * side + dx)
    pattern = sp.csr_matrix((np.ones(sum(r.size for r in voxel_rows)),
                             (np.concatenate(voxel_rows), np.concatenate(voxel_cols))), shape=(side**3, side**3))
    A = sp.kron(pattern, np.ones((channels, channels)), format="csr")
    A.sort_indices()
    A.data = _values(rng, A.nnz)
    return A


def driftband(n: int, rng: np.random.Generator, per_row: int = 20, width: int = 100, step: float = 30.0
              ) -> sp.csr_matrix:
    """Rows whose window of columns drifts: row i draws ``per_row`` columns within ``width`` of a centre that is i
    plus a random walk (steps of sd ``step``, kept inside): neighbouring rows read nearly the same window, which
    wanders thousands of columns off the diagonal and back (one drawn twice counted once)."""
    centre = np.clip(np.arange(n) + np.cumsum(rng.normal(0.0, step, n)), 0, n - 1).astype(np.int64)
    cols = np.repeat(centre, per_row) + rng.integers(-width, width + 1, n * per_row)
    return _csr(np.repeat(np.arange(n), per_row), np.clip(cols, 0, n - 1), (n, n), rng)


def supernodal(n: int, rng: np.random.Generator, narrowest: int = 8, widest: int = 64, fewest: int = 10,
               most: int = 40) -> sp.csr_matrix:
    """A sparse Cholesky factor's pattern stored by rows (lower triangular): supernodes of 8 to 64 consecutive rows;
    each row of a supernode reads the supernode's shared far columns (10 to 40 of the rows before it, at random)
    and its own columns from the supernode's first to itself: row lengths rising through each supernode, groups of
    rows reading one list."""
    widths = rng.integers(narrowest, widest + 1, n // narrowest + 1)
    starts = np.concatenate([[0], np.cumsum(widths)])
    count = int(np.searchsorted(starts, n))
    starts, widths = starts[:count], np.minimum(widths[:count], n - starts[:count])
    rows, cols = [], []
    for s, w in zip(starts.tolist(), widths.tolist(), strict=True):
        far = np.unique(rng.integers(0, s, int(rng.integers(fewest, most + 1)))) if s else np.empty(0, np.int64)
        t = np.arange(w)
        own = np.arange(w * (w + 1) // 2) - np.repeat(t * (t + 1) // 2, t + 1) + s
        rows += [np.repeat(s + t, far.size), np.repeat(s + t, t + 1)]
        cols += [np.tile(far, w), own]
    return _csr(np.concatenate(rows), np.concatenate(cols), (n, n), rng)


def exactcover(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """The exact-cover matrix of an n x n Sudoku (boxes of p x q, p the largest divisor of n up to its square
    root): row (r, c, v) has one column in each of the cell, row-value, column-value and box-value sections."""
    p = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    r, c, v = (a.ravel() for a in np.meshgrid(*(np.arange(n, dtype=np.int64),) * 3, indexing="ij"))
    box = (r // p) * p + c // (n // p)
    cols = np.stack([r * n + c, n * n + r * n + v, 2 * n * n + c * n + v, 3 * n * n + box * n + v], axis=1)
    return _csr(np.repeat(np.arange(n**3), 4), cols.ravel(), (n**3, 4 * n * n), rng)


def resample(rows: int, rng: np.random.Generator, factor: int = 4, taps: int = 16) -> sp.csr_matrix:
    """A decimation filter: row i reads the ``taps`` consecutive columns around ``factor * i`` of
    ``factor * rows`` (cut at the ends)."""
    cols = factor * rows
    first = factor * np.arange(rows, dtype=np.int64) - taps // 2 + factor // 2
    c = (first[:, None] + np.arange(taps)).ravel()
    r = np.repeat(np.arange(rows), taps)
    inside = (c >= 0) & (c < cols)
    return _csr(r[inside], c[inside], (rows, cols), rng)


def subdomains(side: int, rng: np.random.Generator, parts: int = 4) -> sp.csr_matrix:
    """The 7-point Laplacian of a side^3 grid numbered subdomain by subdomain (parts^3 boxes, each lexicographic
    inside), as a domain decomposition numbers its unknowns."""
    z, y, x = (a.ravel() for a in np.meshgrid(*(np.arange(side),) * 3, indexing="ij"))
    edge = -(-side // parts)
    key = (((z // edge) * parts + y // edge) * parts + x // edge) * side**3 + (z * side + y) * side + x
    order = np.argsort(key, kind="stable")
    return _reordered(generate("poisson3d", n=side), order, rng, order)


def tomography(rays: int, rng: np.random.Generator, side: int = 1_000, angles: int = 120) -> sp.csr_matrix:
    """A parallel-beam projector: ``rays`` lines across a side x side image, ``angles`` angles in order, the
    offsets of each at random; a row the pixels its line samples once a pixel's length (about ``side`` of them)."""
    angles = min(angles, rays)
    theta = np.repeat(np.linspace(0.0, np.pi, angles, endpoint=False), -(-rays // angles))[:rays]
    offset = rng.uniform(-0.45, 0.45, rays) * side
    t = np.arange(-side, side, dtype=np.float64) * 0.75  # samples 0.75 of a pixel apart: a pixel a sample or two
    rows, cols = [], []
    for chunk in np.array_split(np.arange(rays), max(1, rays // 2_000)):
        cos, sin = np.cos(theta[chunk])[:, None], np.sin(theta[chunk])[:, None]
        x = side / 2 + t * cos - offset[chunk, None] * sin
        y = side / 2 + t * sin + offset[chunk, None] * cos
        inside = (x >= 0) & (x < side) & (y >= 0) & (y < side)
        rows.append(np.broadcast_to(chunk[:, None], x.shape)[inside])
        cols.append(y[inside].astype(np.int64) * side + x[inside].astype(np.int64))
    return _csr(np.concatenate(rows), np.concatenate(cols), (rays, side * side), rng)


def gnnsample(rows: int, rng: np.random.Generator, nodes: int = 8_000_000, fanout: int = 25, zipf: float = 0.8
              ) -> sp.csr_matrix:
    """A graph network's sampled neighbourhoods: ``fanout`` neighbours drawn for each of ``rows`` seed nodes out
    of ``nodes``, by popularity (a Zipf(``zipf``) rank sent through a random permutation)."""
    s = 1.0 - zipf
    rank = ((nodes**s - 1.0) * rng.random(rows * fanout) + 1.0) ** (1.0 / s)
    cols = rng.permutation(nodes)[np.minimum(rank.astype(np.int64) - 1, nodes - 1)]
    return _csr(np.repeat(np.arange(rows), fanout), cols, (rows, nodes), rng)


def dangling(n: int, rng: np.random.Generator, crawled: float = 0.2, median: float = 20.0, sigma: float = 1.0,
             host: int = 5_000, zipf: float = 0.9) -> sp.csr_matrix:
    """A web crawl's link matrix: ``crawled`` of the pages (at random) have out-links, log-normal in number
    (``median``), half within ``host`` pages of their own, half to pages by popularity (Zipf rank, permuted);
    the other rows empty."""
    pages = np.flatnonzero(rng.random(n) < crawled)
    degrees = np.maximum(1, rng.lognormal(np.log(median), sigma, pages.size).astype(np.int64))
    r = np.repeat(pages, degrees)
    near = rng.random(r.size) < 0.5
    s = 1.0 - zipf
    rank = ((n**s - 1.0) * rng.random(r.size) + 1.0) ** (1.0 / s)
    far = rng.permutation(n)[np.minimum(rank.astype(np.int64) - 1, n - 1)]
    cols = np.where(near, np.clip(r + rng.integers(-host, host + 1, r.size), 0, n - 1), far)
    return _csr(r, cols, (n, n), rng)




def ghostcols(side: int, rng: np.random.Generator) -> sp.csr_matrix:
    """One process's rows of a distributed 7-point Laplacian: its side^3 block of the grid, lexicographic, and
    after its own columns the ghost columns of its six neighbours' faces (side^2 a face, face by face), as a
    solver's local matrix numbers the unknowns it receives: local rows, each face row one far column a face."""
    n = side**3
    A = generate("poisson3d", n=side).tocoo()
    z, y, x = (a.ravel() for a in np.meshgrid(*(np.arange(side),) * 3, indexing="ij"))
    rows, cols = [A.row], [A.col]
    faces = [(x == 0, z, y), (x == side - 1, z, y), (y == 0, z, x), (y == side - 1, z, x), (z == 0, y, x),
             (z == side - 1, y, x)]
    for face, (on, a, b) in enumerate(faces):
        rows.append(np.flatnonzero(on))
        cols.append(n + face * side * side + a[on] * side + b[on])
    return _csr(np.concatenate(rows), np.concatenate(cols), (n, n + 6 * side * side), rng)


def amr3d(side: int, rng: np.random.Generator, radius: float = 0.35, shell: float = 0.08) -> sp.csr_matrix:
    """A finite-volume matrix on an adaptively refined 3-D mesh: a side^3 grid of cells, those near a sphere
    (centres within ``shell`` * side of radius ``radius`` * side) split in eight; each cell coupled to itself and
    the cells sharing a face with it (one of its level, four finer or one coarser a face), cells numbered in Z
    order as octree codes number them."""
    fine = 2 * side
    c = (np.arange(side) + 0.5) / side - 0.5
    split = np.abs(np.sqrt(c[:, None, None] ** 2 + c[None, :, None] ** 2 + c[None, None, :] ** 2) - radius) < shell
    v = np.indices((fine,) * 3).reshape(3, -1)  # each voxel of the fine grid: the first voxel of its cell
    whole = ~split[v[0] // 2, v[1] // 2, v[2] // 2]
    corner = [np.where(whole, (a // 2) * 2, a) for a in v]
    first = (corner[0] * fine + corner[1]) * fine + corner[2]
    z_rank = np.empty(fine**3, dtype=np.int64)
    z_rank[_morton(fine, 3)] = np.arange(fine**3)
    _, cell = np.unique(z_rank[first], return_inverse=True)  # cells by the Z order of their first voxels
    cells = int(cell.max()) + 1
    cell = cell.reshape((fine,) * 3)
    rows, cols = [np.arange(cells)], [np.arange(cells)]
    for axis in range(3):
        a, b = (np.moveaxis(cell, axis, 0)[s].ravel() for s in (slice(None, -1), slice(1, None)))
        across = a != b  # neighbouring voxels of two cells: the cells share a face
        rows += [a[across], b[across]]
        cols += [b[across], a[across]]
    return _csr(np.concatenate(rows), np.concatenate(cols), (cells, cells), rng)


def specelem(elements: int, rng: np.random.Generator, order: int = 7) -> sp.csr_matrix:
    """A 2-D spectral-element matrix: an elements x elements grid of elements of (order + 1)^2 nodes, neighbours
    sharing their edges' nodes; each node coupled to every node of the elements holding it (64 entries a row inside
    an element, 120 on an edge, 225 at a corner), nodes numbered element by element, in the order first met."""
    p, side = order + 1, order * elements + 1
    ey, ex, ly, lx = np.meshgrid(*(np.arange(elements),) * 2, *(np.arange(p),) * 2, indexing="ij")
    node = ((ey * order + ly) * side + ex * order + lx).reshape(elements * elements, p * p)
    _, met = np.unique(node, return_index=True)  # every grid node, where the element-by-element scan first meets it
    number = np.empty(side * side, dtype=np.int64)
    number[np.argsort(met)] = np.arange(side * side)
    local = number[node]
    rows = np.repeat(local, p * p, axis=1).ravel()
    return _csr(rows, np.tile(local, (1, p * p)).ravel(), (side * side, side * side), rng)


def molecules(atoms: int, rng: np.random.Generator, smallest: int = 10, largest: int = 60) -> sp.csr_matrix:
    """A batch of small molecular graphs as a graph network batches them: molecules of ``smallest`` to
    ``largest`` atoms one after another (block diagonal), each a chain-like tree (an atom bonded to one of the
    four before it) with rings (one atom in six bonded 3 to 6 atoms back), numbered at random within the
    molecule; a row an atom, itself and its bonds: 2 to 9 entries (3.2 on average), a molecule's columns within 60."""
    sizes = rng.integers(smallest, largest + 1, atoms // smallest + 1)
    sizes = sizes[:np.searchsorted(np.cumsum(sizes), atoms) + 1]
    molecule = np.repeat(np.arange(sizes.size), sizes)
    start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    k = np.arange(start.size) - start  # an atom's place in its chain
    name = np.empty(start.size, dtype=np.int64)  # its number: at random within its molecule
    name[np.argsort(molecule + rng.random(start.size), kind="stable")] = np.arange(start.size)
    bonded, ring = k > 0, (k >= 6) & (rng.random(k.size) < 1 / 6)
    parent = start + k - rng.integers(1, np.clip(k, 1, 4) + 1)
    back = start + k - rng.integers(3, 7, k.size)
    a = np.concatenate([np.arange(start.size), np.flatnonzero(bonded), np.flatnonzero(ring)])
    b = np.concatenate([np.arange(start.size), parent[bonded], back[ring]])
    return _csr(name[np.concatenate([a, b])], name[np.concatenate([b, a])], (start.size, start.size), rng)


def coupled(side: int, rng: np.random.Generator, median: float = 8.0, sigma: float = 1.5) -> sp.csr_matrix:
    """Two physics in one matrix: the first side^3 rows the 27-point stencil of a 3-D grid (its own columns), the
    next side^3 rows a network over every unknown: log-normal lengths (``median``), random columns."""
    n = side**3
    top = _box_stencil(side, 3).tocoo()
    lengths = np.maximum(1, rng.lognormal(np.log(median), sigma, n).astype(np.int64))
    r = n + np.repeat(np.arange(n), lengths)
    return _csr(np.concatenate([top.row, r]), np.concatenate([top.col, rng.integers(0, 2 * n, r.size)]),
                (2 * n, 2 * n), rng)


def stochgalerkin(side: int, rng: np.random.Generator, variables: int = 6, degree: int = 3) -> sp.csr_matrix:
    """A stochastic Galerkin matrix: the 5-point Laplacian of a side^2 grid coupled through a polynomial chaos
    of ``degree`` in ``variables`` random inputs (84 basis polynomials), unknowns numbered polynomial by
    polynomial: block (i, j) the spatial pattern where the multi-indices of i and j differ by at most one in one
    input, 2 to 9 blocks a block row: a row 2 to 9 stencils (6 to 45 entries), a grid (side^2 columns) apart."""
    basis = np.array([a for a in itertools.product(range(degree + 1), repeat=variables) if sum(a) <= degree])
    G = sp.csr_matrix(np.abs(basis[:, None, :] - basis[None, :, :]).sum(axis=2) <= 1, dtype=np.float64)
    A = sp.kron(G, generate("poisson2d", n=side), format="csr")
    A.data = _values(rng, A.nnz)
    return A

@dataclass(frozen=True)
class Unseen:
    """One matrix of the benchmark: a generator and its size at scale 1 (the side of a ``dims``-D grid where the
    generator's size is one: nonzeros then scale with size ** dims)."""

    name: str
    build: Callable[..., sp.csr_matrix]
    size: int
    seed: int
    group: str = "a"  # "a" the first seven, "b" added after the race's rules were settled, "c" at stop 45,
    # "d" 46, "e" 49, "f" 53, "g" 64, "h" and "i" 65, "j" and "k" 67, "l" and "m" 68, "n" 69, "o" 70, "p" 71, "q" 72,
    # "r" 73, "s" 74, "t" 75, "u" 76
    dims: int = 1

    def size_at(self, scale: float) -> int:
        """The generator's size for ``scale`` (nonzeros scale about linearly with it)."""
        return max(8, round(self.size * scale ** (1 / self.dims)))

    def make(self, scale: float) -> sp.csr_matrix:
        return as_csr(self.build(self.size_at(scale), np.random.default_rng(self.seed)))


MATRICES = (
    Unseen("rgg", rgg, 1_600_000, 11),                 # ~24 M nonzeros
    Unseen("communities", communities, 2_000_000, 12),  # ~40 M
    Unseen("blockdiag", blockdiag, 200_000, 13),       # ~40 M
    Unseen("perm27", perm27, 120, 14, dims=3),         # ~45 M
    Unseen("skyline", skyline, 1_000_000, 15),         # ~35 M
    Unseen("bursts", bursts, 24_000_000, 16),          # ~18 M
    Unseen("communities-large", communities, 8_000_000, 17),  # ~160 M
    Unseen("incidence", incidence, 2_000_000, 21, "b"),        # ~40 M
    Unseen("hubcols", hubcols, 4_000_000, 22, "b"),            # ~24 M
    Unseen("diagonals", diagonals, 3_000_000, 23, "b"),        # ~33 M
    Unseen("denserows", denserows, 4_000, 24, "b"),            # ~16 M
    Unseen("sawtooth", sawtooth, 1_000_000, 25, "b"),          # ~32 M
    Unseen("kkt", kkt, 1_000_000, 26, "b"),                    # ~19 M
    Unseen("mesh2d", mesh2d, 1_200, 31, "c", dims=2),          # ~13 M
    Unseen("fem3x3", fem3x3, 80, 41, "d", dims=3),             # ~31 M
    Unseen("scatterwide", scatterwide, 1_000_000, 42, "d"),    # ~12 M
    Unseen("densepanel", densepanel, 1_000_000, 43, "d"),      # 32 M
    Unseen("mixedrows", mixedrows, 2_000_000, 44, "d"),        # ~36 M
    Unseen("road", road, 1_800, 51, "e", dims=2),              # ~12 M
    Unseen("restrict3d", restrict3d, 100, 52, "e", dims=3),    # ~27 M
    Unseen("prolong3d", prolong3d, 100, 53, "e", dims=3),      # ~27 M
    Unseen("lowertri", lowertri, 500_000, 54, "e"),            # ~21 M
    Unseen("bandnoise", bandnoise, 250_000, 55, "e"),          # ~21 M
    Unseen("tensorprod", tensorprod, 2_000, 56, "e"),          # ~24 M
    Unseen("hypercube", hypercube, 1_000_000, 61, "f"),        # ~21 M
    Unseen("knn3d", knn3d, 1_600_000, 62, "f"),                # ~21 M
    Unseen("dense24", dense24, 6_000, 63, "f", dims=2),        # 18 M
    Unseen("repeatrows", repeatrows, 400_000, 64, "f"),        # ~31 M
    Unseen("webhosts", webhosts, 2_000_000, 65, "f"),          # ~19 M
    Unseen("blockangular", blockangular, 50, 66, "f"),         # ~20 M
    Unseen("debruijn", debruijn, 3_000_000, 71, "g"),          # ~24 M
    Unseen("blocksparse8", blocksparse8, 75_000, 72, "g"),     # ~24 M
    Unseen("smallworld", smallworld, 600_000, 73, "g"),        # ~23 M
    Unseen("rowperm7", rowperm7, 150, 74, "g", dims=3),        # ~23 M
    Unseen("colruns", colruns, 200_000, 75, "g"),              # ~29 M
    Unseen("staircase", staircase, 2_200_000, 76, "g"),        # ~20 M
    Unseen("lengthsorted", lengthsorted, 1_200_000, 81, "h"),      # ~23 M
    Unseen("twofield", twofield, 115, 82, "h", dims=3),            # ~24 M
    Unseen("tallshuffled", tallshuffled, 1_000, 83, "h", dims=2),  # ~32 M
    Unseen("multicolor", multicolor, 100, 84, "h", dims=3),        # ~26 M
    Unseen("blockshuffled", blockshuffled, 1_400, 85, "h", dims=2),  # ~18 M
    Unseen("rowhash9", rowhash9, 1_400, 86, "h", dims=2),          # ~18 M
    Unseen("groupedrows", groupedrows, 1_000_000, 91, "i"),        # ~24 M
    Unseen("denseblock", denseblock, 2_000, 92, "i", dims=2),      # ~36 M
    Unseen("wideclustered", wideclustered, 40_000, 93, "i"),       # ~16 M
    Unseen("hypersparse", hypersparse, 30_000_000, 94, "i"),       # ~15 M
    Unseen("globalcols", globalcols, 2_000_000, 95, "i"),          # ~42 M
    Unseen("tallwide", tallwide, 1_000_000, 96, "i"),              # ~20 M
    Unseen("zipfrows", zipfrows, 2_000_000, 101, "j"),             # ~28 M
    Unseen("stencil125", stencil125, 62, 102, "j", dims=3),        # ~28 M
    Unseen("vbr3d", vbr3d, 70, 103, "j", dims=3),                  # ~28 M
    Unseen("onehot", onehot, 24_000_000, 104, "j"),                # 24 M
    Unseen("antiband", antiband, 1_500_000, 105, "j"),             # 27 M
    Unseen("subsetcols", subsetcols, 2_000_000, 106, "j"),         # ~24 M
    Unseen("fewlongrows", fewlongrows, 64, 111, "k"),              # 16 M
    Unseen("degreesorted", degreesorted, 2_000_000, 112, "k"),     # ~24 M
    Unseen("ndgrid", ndgrid, 1_600, 113, "k", dims=2),             # ~23 M
    Unseen("diagonal", diagonal, 24_000_000, 114, "k"),            # 24 M
    Unseen("bitrev5", bitrev5, 2_000, 115, "k", dims=2),           # ~20 M
    Unseen("log2rows", log2rows, 150_000, 116, "k"),               # ~28 M
    Unseen("onedenserow", onedenserow, 2_000, 121, "l", dims=2),   # ~24 M
    Unseen("topheavy", topheavy, 5_000_000, 122, "l"),             # ~19 M
    Unseen("lattice4d", lattice4d, 12, 123, "l", dims=4),          # ~27 M
    Unseen("termdoc", termdoc, 1_000_000, 124, "l"),               # ~30 M
    Unseen("everyother", everyother, 1_200_000, 125, "l"),         # 24 M
    Unseen("cliques", cliques, 400_000, 126, "l"),                 # ~24 M
    Unseen("blocktri", blocktri, 3_500, 131, "m"),                 # ~24 M
    Unseen("randperm", randperm, 24_000_000, 132, "m"),            # 24 M
    Unseen("window", window, 800_000, 133, "m"),                   # ~24 M
    Unseen("useritem", useritem, 3_000_000, 134, "m"),             # ~26 M
    Unseen("mediumwide", functools.partial(fewlongrows, cols=20_000_000, length=1_000), 24_000, 135, "m"),  # ~24 M
    Unseen("upper27", upper27, 120, 136, "m", dims=3),             # ~24 M
    Unseen("widestencil", widestencil, 36, 141, "n", dims=3),      # ~28 M
    Unseen("morton27", morton27, 100, 142, "n", dims=3),           # ~26 M
    Unseen("colperm27", colperm27, 100, 143, "n", dims=3),         # ~26 M
    Unseen("invertedindex", invertedindex, 1_200_000, 144, "n"),   # ~24 M
    Unseen("cutoff3d", cutoff3d, 80_000, 145, "n"),                # ~24 M
    Unseen("groupby", groupby, 360_000, 146, "n"),                 # ~24 M
    Unseen("prunedlayer", prunedlayer, 16_384, 151, "o", dims=2),  # ~26 M
    Unseen("twofour", twofour, 7_168, 152, "o", dims=2),           # ~26 M
    Unseen("spectralz", spectralz, 80, 153, "o", dims=2),          # ~28 M
    Unseen("erdos", erdos, 100_000, 154, "o"),                     # ~25 M
    Unseen("wideband", wideband, 30_000, 155, "o"),                # ~24 M
    Unseen("randblocks", randblocks, 7_200, 156, "o"),             # ~25 M
    Unseen("hmatrix", hmatrix, 400_000, 161, "p"),                 # ~24 M
    Unseen("circuit", circuit, 3_500_000, 162, "p"),               # ~25 M
    Unseen("tridiag", tridiag, 8_000_000, 163, "p"),               # 24 M
    Unseen("dgblocks", dgblocks, 13, 164, "p", dims=3),            # ~21 M
    Unseen("transposed5", transposed5, 2_200, 165, "p", dims=2),   # ~24 M
    Unseen("bigbird", bigbird, 190_000, 166, "p"),                 # ~24 M
    Unseen("spinchain", spinchain, 2_097_152, 171, "q"),           # ~24 M
    Unseen("dilated", dilated, 1_000, 172, "q", dims=2),           # ~24 M
    Unseen("sellslices", sellslices, 300_000, 173, "q"),           # ~25 M
    Unseen("interleaved", interleaved, 1_000_000, 174, "q"),       # ~25 M
    Unseen("citations", citations, 1_200_000, 175, "q"),           # ~24 M
    Unseen("torus3d", torus3d, 150, 176, "q", dims=3),             # ~24 M
    Unseen("reactdiff", reactdiff, 230, 181, "r", dims=2),         # ~25 M
    Unseen("patree", patree, 8_000_000, 182, "r"),                 # 24 M
    Unseen("kronrandom", kronrandom, 1_000, 183, "r", dims=2),     # ~25 M
    Unseen("sparseblocks", sparseblocks, 30_000, 184, "r"),        # ~26 M
    Unseen("tandemqueue", tandemqueue, 20, 185, "r", dims=5),      # ~27 M
    Unseen("levy", levy, 2_000_000, 186, "r"),                     # ~23 M
    Unseen("matricized", matricized, 1_000_000, 191, "s"),         # ~24 M
    Unseen("maxwell", maxwell, 85, 192, "s", dims=3),              # ~24 M
    Unseen("haar", haar, 1_100_000, 193, "s"),                     # ~24 M
    Unseen("conv3dch", conv3dch, 16, 194, "s", dims=3),            # ~25 M
    Unseen("driftband", driftband, 1_250_000, 195, "s"),           # ~24 M
    Unseen("supernodal", supernodal, 560_000, 196, "s"),           # ~24 M
    Unseen("exactcover", exactcover, 180, 201, "t", dims=3),       # ~23 M
    Unseen("resample", resample, 1_500_000, 202, "t"),             # ~24 M
    Unseen("subdomains", subdomains, 160, 203, "t", dims=3),       # ~28 M
    Unseen("tomography", tomography, 24_000, 204, "t"),            # ~24 M
    Unseen("gnnsample", gnnsample, 1_000_000, 205, "t"),           # ~25 M
    Unseen("dangling", dangling, 4_000_000, 206, "t"),             # ~26 M
    Unseen("ghostcols", ghostcols, 150, 207, "u", dims=3),         # ~24 M
    Unseen("amr3d", amr3d, 106, 208, "u", dims=3),                 # ~23 M
    Unseen("specelem", specelem, 75, 209, "u", dims=2),            # ~22 M
    Unseen("molecules", molecules, 7_300_000, 210, "u"),           # ~23 M
    Unseen("coupled", coupled, 78, 211, "u", dims=3),              # ~24 M
    Unseen("stochgalerkin", stochgalerkin, 107, 212, "u", dims=2),  # ~24 M
)


GROWN = ("a", "b", "c", "d", "e", "f")
"""The sets whose generators the H200's corpus holds since stop 78 (``bench/grow_corpus.py``: each at a sixteenth, a
quarter and half its size here): the H200's shipped selectors have learned from them, so they are no longer unseen
there, and ``bench/unseen.py`` measures the other sets unless told (the H100's selectors have not seen them)."""


def from_suite(name: str) -> list[Unseen]:
    """The matrices of a named suite of :mod:`tuner.matrix.suites`, as this benchmark's (their set: the suite's
    name)."""
    return [Unseen(m.name, functools.partial(_suite_matrix, m), m.size, m.seed, name) for m in suite(name)]


def _suite_matrix(m: SuiteMatrix, size: int, rng: np.random.Generator) -> sp.csr_matrix:
    """``m`` built at ``size`` (its own seed: ``rng`` is not used)."""
    return replace(m, size=size).build()


def columns_permuted(m: Unseen) -> Unseen:
    """``m`` with its columns alone under a random permutation (``--permute-columns``), named ``NAME-colperm``."""
    return replace(m, name=f"{m.name}-colperm", build=functools.partial(_columns_permuted, m.build))


def _columns_permuted(build: Callable[..., sp.csr_matrix], size: int, rng: np.random.Generator) -> sp.csr_matrix:
    return _columns_permuted_of(build(size, rng), rng)
