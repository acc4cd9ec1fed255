# Sourced by scripts/: sets DZR_PYTHON, the Python whose pyarrow wheel gives dzr Apache Arrow C++ (LeRobot datasets)
# and whose PyAV writes the dataset test fixtures: python3 when it has pyarrow, av and numpy, else dzr's own virtual
# environment (scripts/setup.sh makes it), else python3.
DZR_PYDEPS=${DZR_PYDEPS:-$HOME/.cache/dzr/pydeps}
if [[ -z "${DZR_PYTHON:-}" ]]; then
    if python3 -c 'import pyarrow, av, numpy' >/dev/null 2>&1; then
        DZR_PYTHON=$(command -v python3)
    elif [[ -x "$DZR_PYDEPS/bin/python" ]]; then
        DZR_PYTHON="$DZR_PYDEPS/bin/python"
    else
        DZR_PYTHON=$(command -v python3 || echo python3)
    fi
fi
export DZR_PYTHON
