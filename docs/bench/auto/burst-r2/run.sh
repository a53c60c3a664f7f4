#!/usr/bin/env bash
# auto at batch 4, greedy, equal cores, with a 20 s burst of other work (two busy loops) 60 s
# into each bench: the tree before the staleness fix (bcc9c41) and after (working tree).
cd /work/exp/burst
rm -rf old-tree && mkdir old-tree && git -C /work/main archive bcc9c41 saguaro | tar -x -C old-tree
for tree in old new; do
    if [ $tree = old ]; then export PYTHONPATH=/work/exp/burst/old-tree; else export PYTHONPATH=/work/main; fi
    python_bin=/work/main/.venv/bin/python
    $python_bin -c "import saguaro; print('$tree', saguaro.__file__)" >> trees.txt
    ( sleep 75; for i in 1 2; do timeout 20 $python_bin -c "while True: pass" & done; wait ) &
    hog=$!
    date -u +%FT%TZ >> times.txt
    $python_bin -m saguaro.cli bench --modes ar,auto --k 4 --datasets humaneval --temperatures 0 \
        --num-prompts 16 --max-tokens 64 --batch-sizes 4 --repeats 6 --out /work/exp/burst/$tree \
        > /work/exp/burst/$tree.log 2>&1
    wait $hog
done
date -u +%FT%TZ >> times.txt
