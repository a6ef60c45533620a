"""A small training loop written the Accelerate way (it knows nothing of ups-doctor): whatever
`accelerate launch` decides, the program trains with what the Accelerator prepared."""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(640, 16), torch.randn(640, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=32))
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    accelerator.print(f"processes {accelerator.num_processes} final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
